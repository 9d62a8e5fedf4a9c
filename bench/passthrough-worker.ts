/**
 * The bare pass-through Worker bench:edge compares the edge with: it
 * forwards the request to UPSTREAM and streams the answer back, nothing
 * else — no auth, no parsing, no accounting. What the edge costs on top of
 * this is what auth, picking and the usage-sniffing proxy add.
 */
interface PassthroughEnv {
  UPSTREAM: string;
  /** The engine's key, when it requires one (bench:edge's ENGINE_KEY). */
  UPSTREAM_KEY?: string;
}

export default {
  async fetch(request: Request, env: PassthroughEnv): Promise<Response> {
    const url = new URL(request.url);
    const upstream = await fetch(`${env.UPSTREAM}${url.pathname}${url.search}`, {
      method: request.method,
      headers: env.UPSTREAM_KEY
        ? { "content-type": "application/json", authorization: `Bearer ${env.UPSTREAM_KEY}` }
        : { "content-type": "application/json" },
      body: request.body,
    });
    return new Response(upstream.body, { status: upstream.status, headers: upstream.headers });
  },
};
