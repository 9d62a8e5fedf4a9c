/**
 * `--sim-quirks`: ways OpenAI-compatible servers other than vLLM differ
 * from it, so the edge can be tested against them without those servers
 * (docs/sim-engine.md, "Engine quirks"):
 *
 * - `no-done`: streams end after the last chunk, without `data: [DONE]`;
 * - `usage-on-finish`: a stream's usage rides on the last finish chunk, with
 *   no separate `choices: []` usage chunk;
 * - `no-continuous-usage`: `continuous_usage_stats` is ignored;
 * - `fastapi-errors`: errors are FastAPI's `{"detail": …}` (a list of
 *   validation issues for a 400 that names a field);
 * - `pinned-model`: any `model` is accepted and answered as the served name;
 * - `no-usage`: no usage anywhere, whatever `stream_options` ask, so the
 *   edge has to estimate it.
 */
import type { UsageMode } from "../common/usage-mode.ts";

export const QUIRKS = [
  "no-done",
  "usage-on-finish",
  "no-continuous-usage",
  "fastapi-errors",
  "pinned-model",
  "no-usage",
] as const;
export type Quirk = (typeof QUIRKS)[number];
export type Quirks = ReadonlySet<Quirk>;

/** The usage a quirky engine streams when `asked` is what the request's stream_options say. */
export function streamedUsageMode(asked: UsageMode, quirks: Quirks): UsageMode {
  if (quirks.has("no-usage")) return "none";
  return asked === "continuous" && quirks.has("no-continuous-usage") ? "final" : asked;
}

/** An error body as FastAPI writes one: `detail`, a validation list when a field is named. */
export function fastApiErrorBody(status: number, message: string, param: string | null): string {
  if (status === 400 && param) {
    return JSON.stringify({
      detail: [{ loc: ["body", ...param.split(".")], msg: message, type: "value_error" }],
    });
  }
  return JSON.stringify({ detail: message });
}
