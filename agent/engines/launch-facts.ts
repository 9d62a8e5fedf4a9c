/**
 * The Node side of validation: facts gathered from the machine, kept apart
 * from the pure rules in validate.ts so those stay testable without ports
 * or files.
 */
import { accessSync, constants, statSync } from "node:fs";
import { createServer } from "node:net";
import { delimiter, isAbsolute, join, resolve } from "node:path";

/** True when nothing holds `port` on any local address right now. */
export function portFree(port: number, host = "0.0.0.0"): Promise<boolean> {
  return new Promise((done) => {
    const srv = createServer();
    srv.once("error", () => done(false));
    // The wildcard address collides with a listener on any specific address,
    // so one probe covers whatever --host the engine binds.
    srv.listen({ port, host, exclusive: true }, () => srv.close(() => done(true)));
  });
}

/**
 * Probed on the address the engine will bind: several simulated nodes on one
 * host (distinct 127.x addresses) may each use the same port numbers, just
 * as real nodes do.
 */
export async function portsInUse(ports: readonly number[], host?: string): Promise<number[]> {
  const free = await Promise.all(ports.map((p) => portFree(p, host)));
  return ports.filter((_, i) => !free[i]);
}

function executable(path: string): boolean {
  try {
    if (!statSync(path).isFile()) return false;
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** Resolves a command the way execvp would: a name with a slash is a path, otherwise PATH is searched. */
export function findBinary(name: string, path = process.env.PATH ?? ""): string | null {
  if (!name) return null;
  if (name.includes("/")) {
    const p = isAbsolute(name) ? name : resolve(name);
    return executable(p) ? p : null;
  }
  for (const dir of path.split(delimiter)) {
    if (!dir) continue;
    const p = join(dir, name);
    if (executable(p)) return p;
  }
  return null;
}

/**
 * Whether the launch's executable exists. The sim engine runs on the agent's
 * own Node, so what must exist there is the llmgw entry script it is given.
 */
export function binaryFor(engine: string, argv: readonly string[]): { name: string; found: boolean } {
  if (engine === "sim") {
    const entry = argv[1] ?? "";
    let found = false;
    try {
      found = statSync(entry).isFile();
    } catch {
      found = false;
    }
    return { name: entry, found };
  }
  const name = argv[0] ?? "";
  return { name, found: findBinary(name) !== null };
}
