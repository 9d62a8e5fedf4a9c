import { describe, expect, it } from "vitest";
import { createLogger } from "../common/log.ts";
import type { EndpointConfig } from "./config/schema.ts";
import {
  capacityInMetrics,
  metricsUrl,
  type Probe,
  probesDue,
  StaticCapacity,
  withLearnedCapacity,
} from "./static-capacity.ts";

const endpoint = (id: string, url: string, capacity?: EndpointConfig["capacity"]): EndpointConfig => ({
  id,
  url,
  models: ["m"],
  pool: "default",
  weight: 1,
  priority: 0,
  via: "direct",
  ...(capacity ? { capacity } : {}),
});

const CACHE_INFO = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1.0\n';
const SGLANG_METRICS =
  'sglang:max_total_num_tokens{model_name="m",tp_rank="0"} 20480.0\nsglang:num_queue_reqs 0\n';
const RETRY = { baseMs: 5_000, maxMs: 60_000 };

describe("the pure stages", () => {
  it("probes an endpoint that does not state its whole capacity when it is new, when its url changed, and a failure after its delay", () => {
    const probes = new Map<string, Probe>([
      ["learned", { url: "http://a", state: "learned", capacity: { kvTokens: 16_000 } }],
      ["moved", { url: "http://old", state: "learned", capacity: { kvTokens: 16_000 } }],
      ["failed-now", { url: "http://c", state: "failed", failures: 1, at: 10_000 }],
      ["failed-long-ago", { url: "http://d", state: "failed", failures: 3, at: 0 }],
      ["absent", { url: "http://e", state: "absent" }],
      ["probing", { url: "http://f", state: "probing", failures: 0 }],
    ]);
    const due = probesDue(
      [
        endpoint("new", "http://n"),
        endpoint("stated", "http://s", { kv_tokens: 500, max_num_seqs: 8 }),
        endpoint("half-stated", "http://h", { kv_tokens: 500 }),
        endpoint("learned", "http://a"),
        endpoint("moved", "http://new"),
        endpoint("failed-now", "http://c"),
        endpoint("failed-long-ago", "http://d"),
        endpoint("absent", "http://e"),
        endpoint("probing", "http://f"),
      ],
      probes,
      // Past a first failure's 5 s and a third's 20 s.
      25_000,
      RETRY,
    );
    expect(due.map((d) => [d.endpoint.id, d.why])).toEqual([
      ["new", "new endpoint"],
      ["half-stated", "new endpoint"],
      ["moved", "url changed"],
      ["failed-now", "retry"],
      ["failed-long-ago", "retry"],
    ]);
    expect(probesDue([endpoint("failed-now", "http://c")], probes, 14_999, RETRY)).toEqual([]);
    expect(probesDue([endpoint("failed-long-ago", "http://d")], probes, 19_999, RETRY)).toEqual([]);
  });

  it("fills in a learned figure for the url it was learned at; a stated one wins", () => {
    const probes = new Map<string, Probe>([
      ["a", { url: "http://a", state: "learned", capacity: { kvTokens: 16_000 } }],
      ["b", { url: "http://b", state: "learned", capacity: { maxNumSeqs: 48 } }],
      ["c", { url: "http://old", state: "learned", capacity: { kvTokens: 16_000 } }],
    ]);
    const out = withLearnedCapacity(
      [
        endpoint("a", "http://a", { max_num_seqs: 8 }),
        endpoint("b", "http://b", { kv_tokens: 500 }),
        endpoint("c", "http://c"),
        endpoint("d", "http://d"),
      ],
      probes,
    );
    expect(out.map((e) => e.capacity)).toEqual([
      { max_num_seqs: 8, kv_tokens: 16_000 },
      { kv_tokens: 500, max_num_seqs: 48 },
      undefined,
      undefined,
    ]);
  });

  it("finds /metrics at the engine's root, whether or not the url names /v1", () => {
    expect(metricsUrl("http://h:8000")).toBe("http://h:8000/metrics");
    expect(metricsUrl("http://h:8000/")).toBe("http://h:8000/metrics");
    expect(metricsUrl("https://h/v1/")).toBe("https://h/metrics");
    expect(metricsUrl("http://h/engine-3")).toBe("http://h/engine-3/metrics");
  });

  it("reads vLLM's cache-config info and SGLang's pool gauge, and knows SGLang's metrics by their names", () => {
    const dp2 = `${CACHE_INFO}vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="500"} 1.0\n`;
    expect(capacityInMetrics(dp2)).toEqual({ kvTokens: 24_000, sglang: false });
    expect(capacityInMetrics("sglang:num_queue_reqs 0\n")).toEqual({ kvTokens: 0, sglang: true });
    expect(capacityInMetrics(SGLANG_METRICS)).toEqual({ kvTokens: 20_480, sglang: true });
    expect(capacityInMetrics("llamacpp:requests_processing 0\n")).toEqual({ kvTokens: 0, sglang: false });
  });
});

describe("StaticCapacity", () => {
  const harness = (answer: (url: string) => Promise<string>, json?: (url: string) => Promise<unknown>) => {
    const lines: { level: string; msg: string; endpoint?: string; max_num_seqs?: number }[] = [];
    let clock = 0;
    const asked: string[] = [];
    const capacity = new StaticCapacity({
      log: createLogger({}, "info", (l) => lines.push(JSON.parse(l))),
      timeoutMs: () => 1_000,
      now: () => clock,
      retry: RETRY,
      fetchText: (url) => {
        asked.push(url);
        return answer(url);
      },
      fetchJson: (url) => {
        asked.push(url);
        return json ? json(url) : Promise.reject(new Error("no server info here"));
      },
    });
    // Lets the probes started by apply() land.
    const settle = () => new Promise((r) => setImmediate(r));
    return { capacity, lines, asked, settle, advance: (ms: number) => (clock += ms) };
  };

  it("learns once, probes nothing stated, and publishes the figure from the next look on", async () => {
    const h = harness(async () => CACHE_INFO);
    const list = [endpoint("a", "http://a"), endpoint("b", "http://b", { kv_tokens: 500, max_num_seqs: 8 })];
    expect(h.capacity.apply(list)[0]?.capacity).toBeUndefined();
    await h.settle();
    for (let i = 0; i < 5; i++) {
      h.advance(60_000);
      expect(h.capacity.apply(list).map((e) => e.capacity?.kv_tokens)).toEqual([16_000, 500]);
      await h.settle();
    }
    expect(h.asked).toEqual(["http://a/metrics"]);
    expect(h.lines.filter((l) => l.endpoint === "a").map((l) => l.msg)).toEqual([
      "capacity of a static endpoint learned from its /metrics",
    ]);
  });

  it("retries a dark endpoint on its delay, logs it once, and learns when it answers", async () => {
    let up = false;
    const h = harness(async () => {
      if (!up) throw new Error("connect ECONNREFUSED");
      return CACHE_INFO;
    });
    const list = [endpoint("a", "http://a")];
    // A look every second for a minute and a half: 5 s, 10 s, 20 s, 40 s apart.
    for (let s = 0; s < 90; s++) {
      expect(h.capacity.apply(list)[0]?.capacity).toBeUndefined();
      await h.settle();
      h.advance(1_000);
    }
    expect(h.asked).toHaveLength(5);
    expect(h.lines.map((l) => [l.level, l.msg])).toEqual([
      [
        "warn",
        "static endpoint's capacity unreadable: its unstated figures stay unknown while it is retried (state capacity.kv_tokens and capacity.max_num_seqs to skip the probe)",
      ],
    ]);
    up = true;
    h.advance(60_000);
    h.capacity.apply(list);
    await h.settle();
    expect(h.capacity.apply(list)[0]?.capacity?.kv_tokens).toBe(16_000);
    expect(h.lines).toHaveLength(2);
  });

  it("probes again when the url changes, and drops an answer for the url it no longer has", async () => {
    const pending: { url: string; resolve: (text: string) => void }[] = [];
    const h = harness((url) => new Promise((resolve) => pending.push({ url, resolve })));
    h.capacity.apply([endpoint("a", "http://old")]);
    h.capacity.apply([endpoint("a", "http://new")]);
    expect(pending.map((p) => p.url)).toEqual(["http://old/metrics", "http://new/metrics"]);
    pending[0]?.resolve(CACHE_INFO);
    await h.settle();
    expect(h.capacity.apply([endpoint("a", "http://new")])[0]?.capacity).toBeUndefined();
    pending[1]?.resolve('vllm:cache_config_info{block_size="16",num_gpu_blocks="2"} 1\n');
    await h.settle();
    expect(h.capacity.apply([endpoint("a", "http://new")])[0]?.capacity?.kv_tokens).toBe(32);
  });

  it("says once that an endpoint's /metrics state no KV tokens, and does not ask again", async () => {
    const h = harness(async () => "llamacpp:requests_processing 0\n");
    const list = [endpoint("a", "http://a")];
    for (let i = 0; i < 3; i++) {
      expect(h.capacity.apply(list)[0]?.capacity).toBeUndefined();
      await h.settle();
      h.advance(120_000);
    }
    expect(h.asked).toHaveLength(1);
    expect(h.lines.map((l) => l.level)).toEqual(["warn"]);
  });

  it("learns an SGLang engine's batch from its server info beside the pool from its gauge", async () => {
    const info = {
      max_total_num_tokens: 1,
      internal_states: [{ effective_max_running_requests_per_dp: 48 }],
    };
    const h = harness(
      async () => SGLANG_METRICS,
      async () => info,
    );
    const list = [endpoint("a", "http://a/v1"), endpoint("b", "http://b", { max_num_seqs: 8 })];
    h.capacity.apply(list);
    await h.settle();
    await h.settle();
    expect(h.capacity.apply(list).map((e) => e.capacity)).toEqual([
      { kv_tokens: 20_480, max_num_seqs: 48 },
      { max_num_seqs: 8, kv_tokens: 20_480 },
    ]);
    // b states its batch and its metrics gave the pool: nothing more to ask it.
    expect(h.asked).toEqual(["http://a/metrics", "http://b/metrics", "http://a/server_info"]);
    expect(h.lines.map((l) => [l.endpoint, l.msg, l.max_num_seqs])).toEqual([
      ["b", "capacity of a static endpoint learned from its /metrics", undefined],
      ["a", "capacity of a static endpoint learned from its /metrics and /server_info", 48],
    ]);
  });

  it("asks an older SGLang by the route's old name when the new one is not there", async () => {
    const h = harness(
      async () => SGLANG_METRICS,
      async (url) => {
        if (url.endsWith("/get_server_info"))
          return { internal_states: [{ effective_max_running_requests_per_dp: 7 }] };
        throw new Error(`${url}: HTTP 404`);
      },
    );
    const list = [endpoint("a", "http://a")];
    h.capacity.apply(list);
    for (let i = 0; i < 4; i++) await h.settle();
    expect(h.capacity.apply(list)[0]?.capacity).toEqual({ kv_tokens: 20_480, max_num_seqs: 7 });
    expect(h.asked).toEqual(["http://a/metrics", "http://a/server_info", "http://a/get_server_info"]);
  });

  it("retries an SGLang engine whose server info fails, as it would a dark one", async () => {
    let up = false;
    const h = harness(
      async () => SGLANG_METRICS,
      async () => {
        if (!up) throw new Error("HTTP 503");
        return { internal_states: [{ effective_max_running_requests_per_dp: 16 }] };
      },
    );
    const list = [endpoint("a", "http://a")];
    h.capacity.apply(list);
    await h.settle();
    await h.settle();
    expect(h.capacity.apply(list)[0]?.capacity).toBeUndefined();
    up = true;
    h.advance(5_000);
    h.capacity.apply(list);
    await h.settle();
    await h.settle();
    expect(h.capacity.apply(list)[0]?.capacity).toEqual({ kv_tokens: 20_480, max_num_seqs: 16 });
    expect(h.lines.map((l) => l.level)).toEqual(["warn", "info"]);
  });
});
