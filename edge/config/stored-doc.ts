/**
 * A document in KV as this edge reads it: absent, or what its schema makes
 * of it. One that no longer parses (written by another version of the edge,
 * or edited by hand) is read as absent, so requests are still answered, but
 * never silently: the Worker's log names the key and each problem, once per
 * content, so an operator can tell "never written" from "unreadable".
 */
import type { z } from "zod";
import { formatIssues } from "../../common/zod-issues.ts";

/** The content last reported unreadable, per key; bounded, since key names come from traffic. */
const reported = new Map<string, string>();
const MAX_REPORTED = 1_000;

function report(key: string, text: string, problems: string[]): void {
  if (reported.get(key) === text) return;
  if (reported.size >= MAX_REPORTED) reported.clear();
  reported.set(key, text);
  console.error(`KV ${key}: stored document does not parse, read as absent: ${problems.join("; ")}`);
}

/** `text` (what KV holds at `key`, or null) through `schema`; null when absent or unreadable. */
export function parseStored<S extends z.ZodType>(
  key: string,
  text: string | null,
  schema: S,
): z.output<S> | null {
  if (text === null) return null;
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    report(key, text, [`not JSON: ${(err as Error).message}`]);
    return null;
  }
  const r = schema.safeParse(json);
  if (r.success) return r.data;
  report(key, text, formatIssues(r.error));
  return null;
}

/** Reads `key` and parses it as parseStored does. */
export async function readStored<S extends z.ZodType>(
  kv: KVNamespace,
  key: string,
  schema: S,
): Promise<z.output<S> | null> {
  return parseStored(key, await kv.get(key, "text"), schema);
}
