import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { AsyncQueue } from "../../common/async-queue.ts";
import { type AgentMessage, AgentService, type ControlMessage } from "../../proto/gen/agent/v1/agent_pb.ts";

/**
 * Opens one agent stream by hand, sends `messages`, and collects what comes
 * back until the server ends it (or `timeoutMs` passes): how tests play a
 * broken or hostile agent that the real one would never be.
 */
export async function rawAgentStream(
  url: string,
  messages: AgentMessage[],
  opts: { tls?: { ca: string; cert?: string; key?: string }; timeoutMs?: number } = {},
): Promise<{ received: ControlMessage[]; error?: string }> {
  const transport = createConnectTransport({
    baseUrl: url,
    httpVersion: "2",
    ...(opts.tls ? { nodeOptions: opts.tls } : {}),
  });
  const client = createClient(AgentService, transport);
  const out = new AsyncQueue<AgentMessage>();
  for (const m of messages) out.push(m);
  const received: ControlMessage[] = [];
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), opts.timeoutMs ?? 3_000);
  try {
    for await (const m of client.connect(out, { signal: ac.signal })) {
      received.push(m);
      if (m.msg.case === "registerAck") out.close();
    }
    return { received };
  } catch (err) {
    return { received, error: String(err) };
  } finally {
    clearTimeout(timer);
  }
}
