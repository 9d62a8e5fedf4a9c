/**
 * GET an engine's `/metrics` text, bounded in time and in size: the one
 * network step in front of the pure parser (common/prometheus-text.ts).
 * The bound holds while reading, so an endpoint that streams without end is
 * cut off at the limit rather than read into memory first.
 */
import { MAX_METRICS_BYTES } from "./prometheus-text.ts";

export async function fetchMetricsText(url: string, timeoutMs: number): Promise<string> {
  const res = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
  if (!res.ok) {
    await res.body?.cancel();
    throw new Error(`${url}: HTTP ${res.status}`);
  }
  const declared = Number(res.headers.get("content-length") ?? "0");
  if (declared > MAX_METRICS_BYTES) {
    await res.body?.cancel();
    throw new Error(`${url}: metrics body of ${declared} bytes is over the limit`);
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
    if (bytes > MAX_METRICS_BYTES) {
      await reader.cancel();
      throw new Error(`${url}: metrics body over the limit of ${MAX_METRICS_BYTES} bytes`);
    }
    text += decoder.decode(value, { stream: true });
  }
  return text + decoder.decode();
}
