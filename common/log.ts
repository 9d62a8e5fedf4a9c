/**
 * Structured logs: one JSON object per line on stderr, so stdout stays free
 * for what a command prints for people and scripts.
 */
export type LogLevel = "debug" | "info" | "warn" | "error";
const ORDER: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export interface Logger {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
  child(fields: Record<string, unknown>): Logger;
}

/**
 * LLMGW_LOG_LEVEL as a command found it: a message naming what is wrong, or
 * undefined when it is unset or valid. Checked once where a command starts,
 * so a misspelt level fails there instead of quietly logging at info.
 */
export function logLevelProblem(value = process.env.LLMGW_LOG_LEVEL): string | undefined {
  if (value === undefined || value === "" || Object.hasOwn(ORDER, value)) return undefined;
  return `LLMGW_LOG_LEVEL: "${value}" is not one of ${Object.keys(ORDER).join(", ")}`;
}

function envLevel(): LogLevel {
  const v = (typeof process !== "undefined" ? process.env.LLMGW_LOG_LEVEL : undefined) || "info";
  return Object.hasOwn(ORDER, v) ? (v as LogLevel) : "info";
}

export function createLogger(
  base: Record<string, unknown> = {},
  level: LogLevel = envLevel(),
  write: (line: string) => void = (line) => process.stderr.write(`${line}\n`),
): Logger {
  const emit = (lvl: LogLevel, msg: string, fields?: Record<string, unknown>) => {
    if (ORDER[lvl] < ORDER[level]) return;
    write(JSON.stringify({ time: new Date().toISOString(), level: lvl, msg, ...base, ...fields }));
  };
  return {
    debug: (m, f) => emit("debug", m, f),
    info: (m, f) => emit("info", m, f),
    warn: (m, f) => emit("warn", m, f),
    error: (m, f) => emit("error", m, f),
    child: (fields) => createLogger({ ...base, ...fields }, level, write),
  };
}

export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
