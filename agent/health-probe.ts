/** One GET with a hard timeout; true only for a 2xx. Engines answer "not yet" with a refused connection or a 503. */
export async function probeHealth(url: string, timeoutMs: number): Promise<boolean> {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
    await res.body?.cancel();
    return res.ok;
  } catch {
    return false;
  }
}

export function engineUrl(host: string, port: number, path: string): string {
  const h = host.includes(":") ? `[${host}]` : host;
  return `http://${h}:${port}${path}`;
}
