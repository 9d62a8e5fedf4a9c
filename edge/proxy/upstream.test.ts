import { describe, expect, it } from "vitest";
import { engineUrl, type UpstreamFetch, upstreamFor } from "./upstream.ts";

describe("upstream seam", () => {
  const calls: { url: string; headers: Headers }[] = [];
  const direct = async (url: string, init: RequestInit) => {
    calls.push({ url, headers: new Headers(init.headers) });
    return new Response("direct");
  };
  it("direct uses plain fetch", async () => {
    const f = upstreamFor({ id: "e", via: "direct" }, {}, undefined, direct);
    expect(await (await f("http://10.0.0.1:8000/v1/x", {})).text()).toBe("direct");
  });
  it("vpc goes through the named VPC network binding with the engine's private URL", async () => {
    const seen: string[] = [];
    const env = {
      LLMGW_VPC_BINDING: "ONPREM",
      ONPREM: {
        fetch: async (input: string | Request) => {
          seen.push(String(input));
          return new Response("vpc");
        },
      },
    };
    const f = upstreamFor({ id: "e", via: "vpc" }, env, undefined, direct);
    expect(await (await f("http://10.0.1.50:8000/v1/chat/completions", {})).text()).toBe("vpc");
    expect(seen).toEqual(["http://10.0.1.50:8000/v1/chat/completions"]);
    await expect(upstreamFor({ id: "e", via: "vpc" }, {}, undefined, direct)("http://x", {})).rejects.toThrow(
      /no "ONPREM"/,
    );
  });
  it("tunnel adds the Access service-token headers", async () => {
    calls.length = 0;
    const f = upstreamFor(
      { id: "e", via: "tunnel" },
      { CF_ACCESS_CLIENT_ID: "id.access", CF_ACCESS_CLIENT_SECRET: "s3cret" },
      undefined,
      direct,
    );
    await f("https://vllm-a.example.com/v1/x", { headers: { "content-type": "application/json" } });
    expect(calls[0]!.headers.get("cf-access-client-id")).toBe("id.access");
    expect(calls[0]!.headers.get("cf-access-client-secret")).toBe("s3cret");
    expect(calls[0]!.headers.get("content-type")).toBe("application/json");
    expect(calls[0]!.headers.has("authorization")).toBe(false);
    await expect(
      upstreamFor({ id: "e", via: "tunnel" }, {}, undefined, direct)("http://x", {}),
    ).rejects.toThrow(/CF_ACCESS/);
  });
  it("joins endpoint URLs with or without /v1", () => {
    expect(engineUrl("http://h:1", "/v1/completions")).toBe("http://h:1/v1/completions");
    expect(engineUrl("http://h:1/v1/", "/v1/completions")).toBe("http://h:1/v1/completions");
  });
});

describe("the engine's key", () => {
  const KEY = "llmgw-e-0123456789abcdef";
  /** What reached the engine, by whichever way: the URL and the headers. */
  const recorder = () => {
    const seen: { url: string; headers: Headers; body: unknown }[] = [];
    const record: UpstreamFetch = async (url, init) => {
      seen.push({ url, headers: new Headers(init.headers), body: init.body });
      return new Response("ok");
    };
    return { seen, record };
  };
  // The proxy's own headers, as attempt.ts sends them: a plain object.
  const init = () => ({
    method: "POST",
    headers: { "content-type": "application/json", "x-request-id": "req_1" },
    body: "{}",
  });

  it("direct: sent as a bearer token beside the proxy's headers, the caller's init left as it was", async () => {
    const { seen, record } = recorder();
    const sent = init();
    await upstreamFor({ id: "e", via: "direct" }, {}, KEY, record)("http://10.0.0.1:8000/v1/x", sent);
    expect(seen[0]!.headers.get("authorization")).toBe(`Bearer ${KEY}`);
    expect(seen[0]!.headers.get("content-type")).toBe("application/json");
    expect(seen[0]!.headers.get("x-request-id")).toBe("req_1");
    expect(seen[0]!.body).toBe("{}");
    expect(sent.headers).toEqual({ "content-type": "application/json", "x-request-id": "req_1" });
  });

  it("vpc: through the binding, with the key", async () => {
    const { seen, record } = recorder();
    const env = {
      LLMGW_VPC_BINDING: "ONPREM",
      ONPREM: { fetch: (url: string, i?: RequestInit) => record(url, i ?? {}) },
    };
    await upstreamFor({ id: "e", via: "vpc" }, env, KEY)("http://10.0.1.50:8000/v1/x", init());
    expect(seen.map((s) => s.url)).toEqual(["http://10.0.1.50:8000/v1/x"]);
    expect(seen[0]!.headers.get("authorization")).toBe(`Bearer ${KEY}`);
  });

  it("tunnel: the key and the Access service token both", async () => {
    const { seen, record } = recorder();
    const env = { CF_ACCESS_CLIENT_ID: "id.access", CF_ACCESS_CLIENT_SECRET: "s3cret" };
    await upstreamFor(
      { id: "e", via: "tunnel" },
      env,
      KEY,
      record,
    )("https://vllm-a.example.com/v1/x", init());
    expect(seen[0]!.headers.get("authorization")).toBe(`Bearer ${KEY}`);
    expect(seen[0]!.headers.get("cf-access-client-id")).toBe("id.access");
    expect(seen[0]!.headers.get("cf-access-client-secret")).toBe("s3cret");
    expect(seen[0]!.headers.get("content-type")).toBe("application/json");
  });

  it("replaces an Authorization already in the headers, whatever form they take", async () => {
    for (const headers of [
      { Authorization: "Bearer other" },
      new Headers({ authorization: "Bearer other" }),
      [["authorization", "Bearer other"]] as [string, string][],
    ]) {
      const { seen, record } = recorder();
      await upstreamFor({ id: "e", via: "direct" }, {}, KEY, record)("http://h/v1/x", { headers });
      expect(seen[0]!.headers.get("authorization")).toBe(`Bearer ${KEY}`);
    }
  });

  it("without a key: nothing added, and direct is the plain fetch itself, not a wrapper per request", async () => {
    const { seen, record } = recorder();
    for (const via of ["direct", "tunnel"] as const) {
      const env = { CF_ACCESS_CLIENT_ID: "id.access", CF_ACCESS_CLIENT_SECRET: "s3cret" };
      await upstreamFor({ id: "e", via }, env, undefined, record)("http://h/v1/x", init());
    }
    expect(seen.map((s) => s.headers.has("authorization"))).toEqual([false, false]);
    expect(upstreamFor({ id: "e", via: "direct" }, {}, undefined, record)).toBe(record);
    expect(upstreamFor({ id: "e", via: "direct" }, {})).toBe(upstreamFor({ id: "f", via: "direct" }, {}));
  });
});
