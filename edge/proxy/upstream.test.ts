import { describe, expect, it } from "vitest";
import { engineUrl, upstreamFor } from "./upstream.ts";

describe("upstream seam", () => {
  const calls: { url: string; headers: Headers }[] = [];
  const direct = async (url: string, init: RequestInit) => {
    calls.push({ url, headers: new Headers(init.headers) });
    return new Response("direct");
  };
  it("direct uses plain fetch", async () => {
    const f = upstreamFor({ id: "e", via: "direct" }, {}, direct);
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
    const f = upstreamFor({ id: "e", via: "vpc" }, env, direct);
    expect(await (await f("http://10.0.1.50:8000/v1/chat/completions", {})).text()).toBe("vpc");
    expect(seen).toEqual(["http://10.0.1.50:8000/v1/chat/completions"]);
    await expect(upstreamFor({ id: "e", via: "vpc" }, {}, direct)("http://x", {})).rejects.toThrow(
      /no "ONPREM"/,
    );
  });
  it("tunnel adds the Access service-token headers", async () => {
    calls.length = 0;
    const f = upstreamFor(
      { id: "e", via: "tunnel" },
      { CF_ACCESS_CLIENT_ID: "id.access", CF_ACCESS_CLIENT_SECRET: "s3cret" },
      direct,
    );
    await f("https://vllm-a.example.com/v1/x", { headers: { "content-type": "application/json" } });
    expect(calls[0]!.headers.get("cf-access-client-id")).toBe("id.access");
    expect(calls[0]!.headers.get("cf-access-client-secret")).toBe("s3cret");
    expect(calls[0]!.headers.get("content-type")).toBe("application/json");
    await expect(upstreamFor({ id: "e", via: "tunnel" }, {}, direct)("http://x", {})).rejects.toThrow(
      /CF_ACCESS/,
    );
  });
  it("joins endpoint URLs with or without /v1", () => {
    expect(engineUrl("http://h:1", "/v1/completions")).toBe("http://h:1/v1/completions");
    expect(engineUrl("http://h:1/v1/", "/v1/completions")).toBe("http://h:1/v1/completions");
  });
});
