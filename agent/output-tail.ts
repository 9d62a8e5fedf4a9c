import { open } from "node:fs/promises";
import { redacted } from "./engines/adapter.ts";

/**
 * The last lines an engine wrote, read back from its log file rather than
 * kept from a pipe: the engine writes straight into the file so its output
 * survives an agent restart, and an adopted engine's tail is read the same
 * way as a child's.
 */
export const TAIL_LINES = 50;
const MAX_TAIL_BYTES = 64 * 1024;
// A tail is sent upstream on every failure; one runaway line (a tensor dump)
// must not make it megabytes.
const MAX_LINE_CHARS = 2_000;

export async function readTail(path: string, lines = TAIL_LINES, fromOffset = 0): Promise<string[]> {
  let fh: Awaited<ReturnType<typeof open>> | undefined;
  try {
    fh = await open(path, "r");
    const { size } = await fh.stat();
    const start = Math.max(fromOffset, size - MAX_TAIL_BYTES, 0);
    const buf = Buffer.alloc(Math.max(0, size - start));
    if (buf.length > 0) await fh.read(buf, 0, buf.length, start);
    return lastLines(buf.toString("utf8"), lines, start > fromOffset);
  } catch {
    return [];
  } finally {
    await fh?.close();
  }
}

/**
 * The tail as the agent reports it (to the control plane, `ctl explain`,
 * the dashboard): the last TAIL_LINES, the engine's key blanked out, since
 * SGLang prints its command line and settings.
 */
export async function reportedTail(path: string, engineKey: string): Promise<string[]> {
  return (await readTail(path, TAIL_LINES)).map((l) => redacted(l, engineKey));
}

/** Pure: the last `n` non-empty lines of `text`; `cut` drops a first line that began before the window. */
export function lastLines(text: string, n: number, cut = false): string[] {
  let parts = text.split(/\r?\n/);
  if (cut) parts = parts.slice(1);
  return parts
    .filter((l) => l.trim().length > 0)
    .slice(-n)
    .map((l) => (l.length > MAX_LINE_CHARS ? `${l.slice(0, MAX_LINE_CHARS)}…` : l));
}

/**
 * Keeps an engine's log under `maxBytes` without the engine's help: the
 * engine holds the file open in append mode, so truncating it in place and
 * writing back the last `keepBytes` leaves its next write landing at the new
 * end. (A rename would leave it writing into the renamed file forever.)
 * Lines written between the read and the truncate are lost; that is the
 * price of not owning the engine's stdout.
 */
export async function trimLog(path: string, maxBytes: number, keepBytes = MAX_TAIL_BYTES): Promise<boolean> {
  let fh: Awaited<ReturnType<typeof open>> | undefined;
  try {
    fh = await open(path, "r+");
    const { size } = await fh.stat();
    if (size <= maxBytes) return false;
    const keep = Buffer.alloc(Math.min(keepBytes, size));
    await fh.read(keep, 0, keep.length, size - keep.length);
    await fh.truncate(0);
    const note = Buffer.from(`--- llmgw: ${new Date().toISOString()} log trimmed from ${size} bytes\n`);
    await fh.write(Buffer.concat([note, keep]), 0, note.length + keep.length, 0);
    return true;
  } catch {
    return false;
  } finally {
    await fh?.close();
  }
}
