import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { REPO } from "../test/harness/process.ts";
import { parsePrometheusText } from "./prometheus-text.ts";

const fixture = (name: string) => readFileSync(join(REPO, "test/fixtures/metrics", name), "utf8");

describe("parsePrometheusText", () => {
  it("reads a real vLLM scrape: labels, exponents, histograms, comments", () => {
    const { samples, errors } = parsePrometheusText(fixture("vllm.prom"));
    expect(errors).toEqual([]);
    expect(samples).toHaveLength(19);
    expect(samples.find((s) => s.name === "process_resident_memory_bytes")?.value).toBe(3.120771072e9);
    const inf = samples.find((s) => s.labels.le === "+Inf");
    expect(inf).toEqual({
      name: "vllm:time_to_first_token_seconds_bucket",
      labels: { engine: "0", le: "+Inf", model_name: "llama-8b" },
      value: 1503,
    });
  });

  it("skips malformed lines, says which, and keeps the rest", () => {
    const { samples, errors } = parsePrometheusText(fixture("malformed.prom"));
    expect(samples.map((s) => s.name)).toEqual([
      "vllm:num_requests_running",
      "vllm:kv_cache_usage_perc",
      "vllm:prefix_cache_queries_total",
      "process_start_time_seconds",
    ]);
    expect(samples[1]?.labels.model_name).toBe('a "quoted" name, with {braces}');
    expect(Number.isNaN(samples[2]?.value)).toBe(true);
    expect(errors).toEqual([
      "line 4: expected , or } after label",
      'line 5: bad value "twelve"',
      "line 6: label model_name has no quoted value",
      "line 7: no metric name",
      "line 9: expected a space before the value",
      "line 11: expected a value and an optional timestamp",
      "line 12: expected a value and an optional timestamp",
    ]);
  });

  it("can keep only the metrics it is asked for", () => {
    const { samples } = parsePrometheusText(fixture("vllm.prom"), (n) => n.startsWith("vllm:num_"));
    expect(samples.map((s) => s.name)).toEqual(["vllm:num_requests_running", "vllm:num_requests_waiting"]);
  });
});
