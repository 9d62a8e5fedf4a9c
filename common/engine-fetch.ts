/**
 * GETs of an engine's own endpoints (`/metrics`, SGLang's server info),
 * bounded in time and in size: the one network step in front of the pure
 * readers (common/prometheus-text.ts, common/sglang-server-info.ts). The
 * bound holds while reading, so an endpoint that streams without end is cut
 * off at the limit rather than read into memory first.
 */
import { MAX_METRICS_BYTES } from "./prometheus-text.ts";

/** Server info is a page of settings; a megabyte is far past any real one. */
export const MAX_ENGINE_JSON_BYTES = 1 << 20;

export function fetchMetricsText(url: string, timeoutMs: number): Promise<string> {
  return fetchBoundedText(url, timeoutMs, MAX_METRICS_BYTES, "metrics");
}

/**
 * The JSON body at `url`, parsed; throws on a status, a body over the limit
 * or one that is not JSON. `apiKey` goes as a bearer key: an engine
 * launched with one (SGLang) wants it on its server info too.
 */
export async function fetchEngineJson(url: string, timeoutMs: number, apiKey = ""): Promise<unknown> {
  const text = await fetchBoundedText(url, timeoutMs, MAX_ENGINE_JSON_BYTES, "JSON", apiKey);
  try {
    return JSON.parse(text);
  } catch {
    throw new Error(`${url}: body is not JSON`);
  }
}

/**
 * The first of `urls` that is there, as JSON: a 404 moves on to the next (an
 * engine that renamed a route keeps the old one for a while, an older one
 * has only that), any other failure ends the search.
 */
export async function fetchFirstJson(
  urls: readonly string[],
  timeoutMs: number,
  apiKey = "",
  fetchJson: (url: string, timeoutMs: number, apiKey: string) => Promise<unknown> = fetchEngineJson,
): Promise<{ url: string; body: unknown }> {
  let notFound: unknown;
  for (const url of urls) {
    try {
      return { url, body: await fetchJson(url, timeoutMs, apiKey) };
    } catch (err) {
      if (!(err instanceof Error && err.message.endsWith(": HTTP 404"))) throw err;
      notFound = err;
    }
  }
  throw notFound ?? new Error("no url to ask");
}

async function fetchBoundedText(
  url: string,
  timeoutMs: number,
  limit: number,
  what: string,
  apiKey = "",
): Promise<string> {
  const headers: Record<string, string> = apiKey ? { authorization: `Bearer ${apiKey}` } : {};
  const res = await fetch(url, { signal: AbortSignal.timeout(timeoutMs), headers });
  if (!res.ok) {
    await res.body?.cancel();
    throw new Error(`${url}: HTTP ${res.status}`);
  }
  const declared = Number(res.headers.get("content-length") ?? "0");
  if (declared > limit) {
    await res.body?.cancel();
    throw new Error(`${url}: ${what} body of ${declared} bytes is over the limit`);
  }
  if (!res.body) return "";
  const decoder = new TextDecoder();
  let text = "";
  let bytes = 0;
  const reader = res.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    bytes += value.byteLength;
    if (bytes > limit) {
      await reader.cancel();
      throw new Error(`${url}: ${what} body over the limit of ${limit} bytes`);
    }
    text += decoder.decode(value, { stream: true });
  }
  return text + decoder.decode();
}
