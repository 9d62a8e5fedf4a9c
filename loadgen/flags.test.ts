import { describe, expect, it } from "vitest";
import { describeError } from "./chat-stream.ts";
import { type BenchFlags, parseBenchFlags } from "./flags.ts";

const parse = (args: string, env: NodeJS.ProcessEnv = {}) =>
  parseBenchFlags(args.split(" ").filter(Boolean), env) as BenchFlags;

describe("llmgw bench flags", () => {
  it("fills defaults and tolerates a /v1 suffix", () => {
    const f = parse("--url http://127.0.0.1:8787/v1/ --concurrency 1,8");
    expect(f.url).toBe("http://127.0.0.1:8787");
    expect(f.load).toEqual({ kind: "concurrency", values: [1, 8] });
    expect(f.level).toEqual({ seconds: 30 });
    expect(f.workload.kind).toBe("shared-prefix");
    expect(f.timeoutMs).toBe(300_000);
    expect(f.timeScale).toBe(1);
    expect(f.apiKey).toBeUndefined();
  });

  it("reads the API key from the environment only", () => {
    expect(parse("--url http://h --rate 1", { OPENAI_API_KEY: "sk-b" }).apiKey).toBe("sk-b");
    expect(parse("--url http://h --rate 1", { LLMGW_API_KEY: "sk-a", OPENAI_API_KEY: "sk-b" }).apiKey).toBe(
      "sk-a",
    );
    expect(() => parse("--url http://h --rate 1 --api-key sk-x")).toThrow(/Unknown option '--api-key'/);
    expect(() => parse("--url http://h --rate 1 --header Authorization:Bearer")).toThrow(
      /^--header: the API key comes from \$LLMGW_API_KEY/,
    );
  });

  it("names the flag in every value error", () => {
    const cases: [string, RegExp][] = [
      ["--url ftp://x --rate 1", /^--url: expected an http/],
      ["--url http://h --rate 1,x", /^--rate: /],
      ["--url http://h --rate 0", /^--rate: /],
      ["--url http://h --concurrency 2.5", /^--concurrency: /],
      ["--url http://h --rate 1 --duration 30", /^--duration: invalid duration "30"/],
      ["--url http://h --rate 1 --requests 0", /^--requests: /],
      ["--url http://h --rate 1 --workload chat", /^--workload: /],
      ["--url http://h --rate 1 --header nocolon", /^--header: expected NAME:VALUE/],
      ["--url http://h --rate 1 --workload band-mix --bands gold=x", /^--bands: "gold=x" is not BAND=WEIGHT/],
      ["--url http://h --rate 1 --workload band-mix --bands gold=0", /^--bands: at least one band/],
      ["--url http://h --rate 1 --prompt-spread 2", /^--prompt-spread: /],
      ["--url http://h --rate 1 --time-scale=-1", /^--time-scale: /],
      ["--url http://h --rate 1 --time-scale 0", /^--time-scale: /],
    ];
    for (const [args, message] of cases) expect(() => parse(args), args).toThrow(message);
  });

  it("wants exactly one kind of load and one level length", () => {
    expect(() => parse("--url http://h")).toThrow(/one of --rate .* or --concurrency/);
    expect(() => parse("--url http://h --rate 1 --concurrency 2")).toThrow(
      /^--rate and --concurrency: one or the other, not both/,
    );
    expect(() => parse("--url http://h --rate 1 --duration 5s --requests 3")).toThrow(/not both/);
    expect(() => parse("--rate 1")).toThrow(/--url is required/);
    expect(parse("--url http://h --rate 0.5,2 --requests 7").level).toEqual({ requests: 7 });
    expect(parse("--url http://h --rate 1 --duration 1m30s").level).toEqual({ seconds: 90 });
  });

  it("refuses a workload flag the chosen workload would ignore", () => {
    expect(() => parse("--url http://h --rate 1 --prompt-tokens 5")).toThrow(
      /^--prompt-tokens: applies to the random/,
    );
    expect(() => parse("--url http://h --rate 1 --workload random --groups 5")).toThrow(
      /^--groups: applies to the shared-prefix/,
    );
    expect(() => parse("--url http://h --rate 1 --bands gold=1")).toThrow(
      /^--bands: applies to --workload band-mix/,
    );
    expect(() => parse("--url http://h --rate 1 --workload band-mix --groups 5")).toThrow(/^--groups/);
  });

  it("builds each workload's options", () => {
    const sp = parse(
      "--url http://h --rate 1 --groups 150 --system-tokens 6000 --turns 1 --output-tokens 9 --ignore-eos",
    );
    expect(sp.workload).toEqual({
      kind: "shared-prefix",
      options: {
        groups: 150,
        usersPerGroup: 5,
        systemTokens: 6000,
        questionTokens: 200,
        outputTokens: 9,
        turns: 1,
        ignoreEos: true,
      },
    });
    const bm = parse(
      "--url http://h --rate 1 --workload band-mix --band-base shared-prefix --bands gold=3,bronze=1 --groups 2",
    );
    expect(bm.workload).toMatchObject({
      kind: "band-mix",
      base: "shared-prefix",
      bands: { gold: 3, bronze: 1 },
    });
    expect(bm.workload.options).toMatchObject({ groups: 2 });
    const rnd = parse("--url http://h --rate 1 --workload band-mix --prompt-tokens 50");
    expect(rnd.workload).toMatchObject({
      kind: "band-mix",
      base: "random",
      bands: { platinum: 0.1, gold: 0.3, silver: 0.3, bronze: 0.3 },
      options: { promptTokens: 50 },
    });
  });

  it("keeps repeated headers, names lower-cased", () => {
    const f = parseBenchFlags(
      ["--url", "http://h", "--rate", "1", "--header", "X-LLMGW-Band:silver", "--header", "x-a: b c:d"],
      {},
    ) as BenchFlags;
    expect(f.headers).toEqual({ "x-llmgw-band": "silver", "x-a": "b c:d" });
  });
});

describe("error bodies", () => {
  it("reads OpenAI's shape, vLLM's flat and numeric-code shapes, and text", () => {
    expect(
      describeError(
        '{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit_exceeded"}}',
      ),
    ).toEqual({
      code: "rate_limit_exceeded",
      message: "slow down",
    });
    expect(
      describeError('{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}'),
    ).toEqual({
      code: "InternalServerError",
      message: "boom",
    });
    expect(describeError('{"object":"error","message":"bad","type":"BadRequestError","code":400}')).toEqual({
      code: "BadRequestError",
      message: "bad",
    });
    expect(describeError("<html>502 Bad Gateway</html>")).toEqual({
      message: "<html>502 Bad Gateway</html>",
    });
    expect(describeError("")).toEqual({ message: "(empty body)" });
  });
});
