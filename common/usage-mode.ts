/**
 * How much token usage an OpenAI stream carries, as vLLM reads
 * `stream_options`: without include_usage chunks carry no `usage` key; with
 * it, token chunks carry `"usage":null` and a final `choices: []` chunk
 * carries the totals; with continuous_usage_stats too, every chunk carries
 * the running totals (continuous stats never apply without include_usage).
 *
 * One reading for both sides of the wire: the sim engine writes streams in
 * the mode a request asks for, and the edge cuts what it injected back to
 * the mode the client asked for. Pure, no runtime APIs: the edge bundles it.
 */
export type UsageMode = "none" | "final" | "continuous";

export function usageModeOf(
  opts: { include_usage?: boolean | null; continuous_usage_stats?: boolean | null } | null | undefined,
): UsageMode {
  if (!opts?.include_usage) return "none";
  return opts.continuous_usage_stats ? "continuous" : "final";
}
