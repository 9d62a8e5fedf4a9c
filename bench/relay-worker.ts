/**
 * The floor bench:edge measures the edge against besides the bare
 * pass-through: the least a Worker must do to meet the edge's streaming
 * contract. It holds the response until the engine's first SSE data event
 * (so a failure before the first token could still be retried or answered
 * with a status) and then relays every chunk through JavaScript (so each
 * could be read for usage and rewritten), with no auth, parsing or
 * accounting. The gap from the pass-through to this Worker is what running
 * JavaScript per chunk costs in workerd; the gap from this Worker to the
 * edge is what the edge's own logic costs.
 */
interface RelayEnv {
  UPSTREAM: string;
}

export default {
  async fetch(request: Request, env: RelayEnv, ctx: ExecutionContext): Promise<Response> {
    const url = new URL(request.url);
    const upstream = await fetch(`${env.UPSTREAM}${url.pathname}${url.search}`, {
      method: request.method,
      headers: { "content-type": "application/json" },
      body: request.body,
    });
    if (!upstream.body || upstream.status !== 200) {
      return new Response(upstream.body, { status: upstream.status, headers: upstream.headers });
    }
    const reader = upstream.body.getReader();
    const decoder = new TextDecoder();
    const held: Uint8Array[] = [];
    for (;;) {
      const r = await reader.read();
      if (r.done) break;
      held.push(r.value);
      if (decoder.decode(r.value, { stream: true }).includes("data:")) break;
    }
    const pipe = new IdentityTransformStream();
    const writer = pipe.writable.getWriter();
    for (const chunk of held) writer.write(chunk).catch(() => {});
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
