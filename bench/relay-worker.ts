/**
 * The floor bench:edge measures the edge against besides the bare
 * pass-through: the least a Worker must do to meet the edge's streaming
 * contract as configured by default (`stream_commit: headers`). It answers
 * at the engine's headers and then relays every chunk through JavaScript
 * (so each could be read for usage, rewritten, or the stream cut off with
 * an error event), with no auth, parsing or accounting. The gap from the
 * pass-through to this Worker is what running JavaScript per chunk costs
 * in workerd; the gap from this Worker to the edge is what the edge's own
 * logic costs.
 */
interface RelayEnv {
  UPSTREAM: string;
  /** The engine's key, when it requires one (bench:edge's ENGINE_KEY). */
  UPSTREAM_KEY?: string;
}

export default {
  async fetch(request: Request, env: RelayEnv, ctx: ExecutionContext): Promise<Response> {
    const url = new URL(request.url);
    const upstream = await fetch(`${env.UPSTREAM}${url.pathname}${url.search}`, {
      method: request.method,
      headers: env.UPSTREAM_KEY
        ? { "content-type": "application/json", authorization: `Bearer ${env.UPSTREAM_KEY}` }
        : { "content-type": "application/json" },
      body: request.body,
    });
    if (!upstream.body || upstream.status !== 200) {
      return new Response(upstream.body, { status: upstream.status, headers: upstream.headers });
    }
    const reader = upstream.body.getReader();
    const pipe = new IdentityTransformStream();
    const writer = pipe.writable.getWriter();
    ctx.waitUntil(
      (async () => {
        for (;;) {
          const r = await reader.read();
          if (r.done) break;
          writer.write(r.value).catch(() => {});
        }
        await writer.close();
      })().catch(() => {}),
    );
    return new Response(pipe.readable, { status: 200, headers: upstream.headers });
  },
};
