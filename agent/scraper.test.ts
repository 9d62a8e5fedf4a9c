import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parsePrometheusText } from "../common/prometheus-text.ts";
import { capacityFromServerInfo, SGLANG_SERVER_INFO_PATHS } from "../common/sglang-server-info.ts";
import { REPO } from "../test/harness/process.ts";
import { SGLANG_METRICS, VLLM_METRICS } from "./engines/adapter.ts";
import { LoadScraper, loadFromSamples } from "./scraper.ts";

const fixture = (name: string) => readFileSync(join(REPO, "test/fixtures/metrics", name), "utf8");

describe("loadFromSamples", () => {
  it("counts what a scrape with malformed lines could read, and names what is missing", () => {
    const load = loadFromSamples(parsePrometheusText(fixture("malformed.prom")).samples, VLLM_METRICS);
    expect(load).toMatchObject({ running: 4, waiting: 0, kvUsage: 1, prefixCacheHitRate: 0 });
    expect(load.missing).toEqual([
      "vllm:num_requests_waiting",
      "vllm:prefix_cache_queries",
      "vllm:prefix_cache_hits",
    ]);
  });

  it("reads the KV cache's tokens off cache_config_info, summed over data-parallel engines", () => {
    const text = [
      'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="27669"} 1.0',
      'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1.0',
      "vllm:num_requests_waiting 0",
    ].join("\n");
    const { samples } = parsePrometheusText(text);
    expect(loadFromSamples(samples, VLLM_METRICS).kvCapacityTokens).toBe((27_669 + 1_000) * 16);
    expect(loadFromSamples(samples, SGLANG_METRICS).kvCapacityTokens).toBe(0);
    const junk = parsePrometheusText('vllm:cache_config_info{block_size="x",num_gpu_blocks="9"} 1').samples;
    expect(loadFromSamples(junk, VLLM_METRICS).kvCapacityTokens).toBe(0);
  });

  it("vLLM: gauges, and the hit rate from _total counters (lifetime on the first scrape)", () => {
    const r = loadFromSamples(parsePrometheusText(fixture("vllm.prom")).samples, VLLM_METRICS);
    expect(r).toMatchObject({
      waiting: 3,
      running: 7,
      kvUsage: 0.4172,
      prefixCacheHitRate: 0.25,
      missing: [],
    });
    expect(r.counters).toEqual({ queries: 120_000, hits: 30_000 });
  });

  it("vLLM: a rate between scrapes, the old rate over an idle interval, fresh counts after a reset", () => {
    const names = VLLM_METRICS;
    const at = (q: number, h: number) =>
      parsePrometheusText(
        `vllm:prefix_cache_queries_total ${q}\nvllm:prefix_cache_hits_total ${h}\n` +
          "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n",
      ).samples;
    const a = loadFromSamples(at(1000, 100), names);
    const b = loadFromSamples(at(2000, 1000), names, a);
    expect(b.prefixCacheHitRate).toBe(0.9);
    const idle = loadFromSamples(at(2000, 1000), names, b);
    expect(idle.prefixCacheHitRate).toBe(0.9);
    const reset = loadFromSamples(at(100, 50), names, idle);
    expect(reset.prefixCacheHitRate).toBe(0.5);
  });

  it("vLLM data parallel: counts add up, KV use averages, counters without _total", () => {
    const r = loadFromSamples(parsePrometheusText(fixture("vllm-dp2.prom")).samples, VLLM_METRICS);
    expect(r).toMatchObject({ running: 22, waiting: 1, prefixCacheHitRate: 0.5, missing: [] });
    expect(r.kvUsage).toBeCloseTo(0.7);
  });

  it("SGLang: queue, running, token usage and the hit-rate gauge", () => {
    const r = loadFromSamples(parsePrometheusText(fixture("sglang.prom")).samples, SGLANG_METRICS);
    expect(r).toMatchObject({
      waiting: 5,
      running: 24,
      kvUsage: 0.73,
      prefixCacheHitRate: 0.512,
      missing: [],
    });
    // This scrape predates the pool-size gauge: no KV figure, not a wrong one.
    expect(r.kvCapacityTokens).toBe(0);
  });

  it("SGLang: the pool's tokens from its gauge, one pool per data-parallel rank", () => {
    const text = [
      'sglang:max_total_num_tokens{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",dp_rank="0"} 10000.0',
      'sglang:max_total_num_tokens{model_name="m",engine_type="unified",tp_rank="1",pp_rank="0",dp_rank="0"} 10000.0',
      'sglang:max_total_num_tokens{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",dp_rank="1"} 10000.0',
    ].join("\n");
    expect(loadFromSamples(parsePrometheusText(text).samples, SGLANG_METRICS).kvCapacityTokens).toBe(20_000);
  });
});

describe("LoadScraper", () => {
  it("fetches, parses into a ShardLoad, and times out on a hung engine", async () => {
    const body = fixture("vllm.prom");
    let hang = false;
    const srv = createServer((req, res) => {
      if (hang) return; // never answers
      res.end(req.url === "/metrics" ? body : "");
    });
    await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
    const port = (srv.address() as { port: number }).port;
    try {
      const s = new LoadScraper("127.0.0.1", port, "/metrics", VLLM_METRICS, 300, () => 1234);
      const { load } = await s.scrape();
      expect(load).toMatchObject({ waiting: 3, running: 7, kvUsage: 0.4172, prefixCacheHitRate: 0.25 });
      expect(load.scrapedAtUnixMs).toBe(1234n);
      hang = true;
      // Given up by its own timeout, not left hanging on the engine.
      await expect(s.scrape()).rejects.toMatchObject({ name: "TimeoutError" });
    } finally {
      srv.closeAllConnections();
      srv.close();
    }
  });
});

describe("LoadScraper's capacity probe", () => {
  const info = {
    max_total_num_tokens: 9000,
    internal_states: [{ effective_max_running_requests_per_dp: 48 }],
  };

  async function engine(answer: () => { status: number; body: string }) {
    const asked: string[] = [];
    const srv = createServer((req, res) => {
      asked.push(req.url ?? "");
      if (req.url === "/metrics") return res.end("sglang:num_running_reqs 1\nsglang:num_queue_reqs 0\n");
      // An SGLang from before the route's rename: only the old name is there.
      if (req.url === "/server_info") return res.writeHead(404).end('{"detail":"Not Found"}');
      const a = answer();
      res.writeHead(a.status).end(a.body);
    });
    await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
    const port = (srv.address() as { port: number }).port;
    const outcomes: unknown[] = [];
    /** Its scraper as the agent builds one for SGLang, launched with `--max-running-requests 64`. */
    const scraper = (now: () => number) =>
      new LoadScraper(
        "127.0.0.1",
        port,
        "/metrics",
        SGLANG_METRICS,
        500,
        now,
        { maxNumSeqs: 64, probe: { paths: SGLANG_SERVER_INFO_PATHS, read: capacityFromServerInfo } },
        (o) => outcomes.push(o),
      );
    return { srv, asked, outcomes, scraper };
  }

  it("learns the batch and pool from the server info once, over what the launch said", async () => {
    const e = await engine(() => ({ status: 200, body: JSON.stringify(info) }));
    try {
      const s = e.scraper(() => 0);
      for (let i = 0; i < 3; i++) {
        const { load } = await s.scrape();
        expect(load).toMatchObject({ maxNumSeqs: 48, kvCapacityTokens: 9000n });
      }
      expect(e.asked.filter((u) => u.endsWith("server_info"))).toEqual(["/server_info", "/get_server_info"]);
      expect(e.outcomes).toEqual([{ learned: { maxNumSeqs: 48, kvTokens: 9000 } }]);
    } finally {
      e.srv.closeAllConnections();
      e.srv.close();
    }
  });

  it("keeps the launch's figure while the probe fails, and asks again only after its delay", async () => {
    let ok = false;
    const e = await engine(() =>
      ok ? { status: 200, body: JSON.stringify(info) } : { status: 503, body: "" },
    );
    let now = 0;
    try {
      const s = e.scraper(() => now);
      expect((await s.scrape()).load.maxNumSeqs).toBe(64);
      ok = true;
      now = 4_999;
      expect((await s.scrape()).load.maxNumSeqs).toBe(64);
      expect(e.asked.filter((u) => u === "/get_server_info")).toHaveLength(1);
      now = 5_000;
      expect((await s.scrape()).load.maxNumSeqs).toBe(48);
      expect(e.outcomes).toHaveLength(2);
      expect(e.outcomes[0]).toMatchObject({ failures: 1, error: expect.stringContaining("HTTP 503") });
    } finally {
      e.srv.closeAllConnections();
      e.srv.close();
    }
  });
});
