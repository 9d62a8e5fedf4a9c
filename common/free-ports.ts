/**
 * Ports for processes about to be started on loopback, handed out so that
 * two test files running at once, or a test and the stack it spawns, never
 * get the same one.
 *
 * Asking the kernel for port 0 and closing it is not enough: the port goes
 * back to the ephemeral range, where the next outgoing connection of any
 * process may take it before the child binds it (a Miniflare start failed
 * with EADDRINUSE that way). So ports come from below Linux's ephemeral
 * range (32768-60999) and above `npm start`'s engine ports (20000-20999),
 * and each is recorded as a file in a directory every process on the
 * machine shares: a port recorded in the last few minutes
 * is not handed out again, whoever asks (unless every one is).
 *
 * Part of the harness (tests, benchmarks, `npm start`'s scripts), never of
 * the installed package.
 */
import { closeSync, mkdirSync, openSync, renameSync, statSync, unlinkSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** Single ports, for listeners. */
const SINGLES = { first: 27_000, last: 32_767 };
/** Blocks, for a control plane's engines; apart, so scattered singles never split them. */
const BLOCKS = { first: 21_000, last: 26_999 };
/** Long enough for the slowest test to bind what it was given. */
const HELD_MS = 10 * 60_000;
const DIR = join(tmpdir(), "llmgw-ports");

/** One port, free now and not handed to anyone else in the last minutes. */
export async function freePort(): Promise<number> {
  return (await take(SINGLES, 1))[0]!;
}

/**
 * `count` consecutive ports, for a range a process hands out itself (a
 * control plane's `control.port_range`).
 */
export function freePortBlock(count: number): Promise<number[]> {
  return take(BLOCKS, count);
}

async function take(range: { first: number; last: number }, count: number): Promise<number[]> {
  mkdirSync(DIR, { recursive: true, mode: 0o700 });
  // Blocks sit on multiples of their size, so two blocks overlap only when equal.
  const slots = Math.floor((range.last - range.first + 1) / count);
  const start = Math.floor(Math.random() * slots);
  const candidates = Array.from({ length: slots }, (_, i) => {
    const first = range.first + ((start + i) % slots) * count;
    return Array.from({ length: count }, (_, k) => first + k);
  });
  for (const ports of candidates) {
    if (!ports.every(reserve)) continue;
    if ((await Promise.all(ports.map(bindable))).every(Boolean)) return ports;
  }
  // Every record is recent (many runs in a few minutes): what is free now will do.
  for (const ports of candidates) if ((await Promise.all(ports.map(bindable))).every(Boolean)) return ports;
  throw new Error(`no ${count} free port(s) in ${range.first}-${range.last}`);
}

/** Records `port` as handed out; false when someone did so in the last HELD_MS. */
function reserve(port: number): boolean {
  const path = join(DIR, String(port));
  if (create(path)) return true;
  try {
    if (Date.now() - statSync(path).mtimeMs < HELD_MS) return false;
    // An old record: move it aside first, so of two processes that both
    // found it old only the one whose rename succeeded re-creates it.
    const aside = `${path}.${process.pid}.${Math.random().toString(36).slice(2)}`;
    renameSync(path, aside);
    unlinkSync(aside);
  } catch {
    return false;
  }
  return create(path);
}

function create(path: string): boolean {
  try {
    closeSync(openSync(path, "wx", 0o600));
    return true;
  } catch {
    return false;
  }
}

function bindable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.unref();
    srv.once("error", () => resolve(false));
    srv.listen(port, "127.0.0.1", () => srv.close(() => resolve(true)));
  });
}
