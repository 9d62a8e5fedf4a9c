import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { fetchEngineJson, fetchFirstJson, fetchMetricsText, MAX_ENGINE_JSON_BYTES } from "./engine-fetch.ts";
import { MAX_METRICS_BYTES } from "./prometheus-text.ts";

describe("fetchMetricsText", () => {
  const servers: ReturnType<typeof createServer>[] = [];
  afterEach(() => {
    for (const s of servers.splice(0)) {
      s.closeAllConnections();
      s.close();
    }
  });
  const serve = async (handler: Parameters<typeof createServer>[1]) => {
    const srv = createServer(handler);
    servers.push(srv);
    await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
    return `http://127.0.0.1:${(srv.address() as AddressInfo).port}/metrics`;
  };

  it("returns the text, and names the status of a refusal", async () => {
    const url = await serve((req, res) => {
      if (req.url === "/metrics") res.end("vllm:num_requests_running 2\n");
      else res.writeHead(404).end();
    });
    expect(await fetchMetricsText(url, 1_000)).toBe("vllm:num_requests_running 2\n");
    await expect(fetchMetricsText(url.replace("/metrics", "/nope"), 1_000)).rejects.toThrow("HTTP 404");
  });

  it("stops reading a body without a length once it passes the limit", async () => {
    let written = 0;
    const url = await serve((_req, res) => {
      // Chunked and endless: only the reader's bound ends it.
      const line = Buffer.alloc(64 * 1024, "#");
      const more = () => {
        while (!res.destroyed && res.write(line)) written += line.length;
        if (!res.destroyed) res.once("drain", more);
      };
      more();
    });
    await expect(fetchMetricsText(url, 10_000)).rejects.toThrow("over the limit");
    expect(written).toBeLessThan(4 * MAX_METRICS_BYTES);
  });

  it("parses an engine's JSON, and says so when a body is not JSON or is too large", async () => {
    const url = await serve((req, res) => {
      if (req.url === "/get_server_info") res.end('{"max_total_num_tokens":20480}');
      else if (req.url === "/big") res.end(`"${"x".repeat(MAX_ENGINE_JSON_BYTES)}"`);
      else res.end("<html>not here</html>");
    });
    const base = url.replace("/metrics", "");
    expect(await fetchEngineJson(`${base}/get_server_info`, 1_000)).toEqual({ max_total_num_tokens: 20480 });
    await expect(fetchEngineJson(`${base}/other`, 1_000)).rejects.toThrow("body is not JSON");
    await expect(fetchEngineJson(`${base}/big`, 1_000)).rejects.toThrow("JSON body of");
  });

  it("asks urls in order past a 404, and stops at any other failure", async () => {
    const url = await serve((req, res) => {
      if (req.url === "/new") res.writeHead(404).end();
      else if (req.url === "/old") res.end('{"v":1}');
      else res.writeHead(500).end();
    });
    const base = url.replace("/metrics", "");
    expect(await fetchFirstJson([`${base}/new`, `${base}/old`], 1_000)).toEqual({
      url: `${base}/old`,
      body: { v: 1 },
    });
    await expect(fetchFirstJson([`${base}/broken`, `${base}/old`], 1_000)).rejects.toThrow("HTTP 500");
    await expect(fetchFirstJson([`${base}/new`], 1_000)).rejects.toThrow("HTTP 404");
  });
});
