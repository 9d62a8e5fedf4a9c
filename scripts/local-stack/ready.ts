import type { Client } from "@connectrpc/connect";
import type { ControlService } from "../../proto/gen/control/v1/control_pb.ts";

/**
 * When `npm start` may say the stack is up: every model the control plane
 * keeps replicas of has them all ready, and a request for it through the
 * edge succeeds. Ready replicas alone are not enough — the edge hears of
 * them in the control plane's next publication, a moment later, and until
 * then answers 503 `no_endpoints` — so the last word is a real request, the
 * one a user is about to send (a one-token chat, with the user's key).
 *
 * Returns null when ready, else what is still awaited, for the error a
 * start that never gets there ends with.
 */
export async function awaiting(
  control: Client<typeof ControlService>,
  edgeUrl: string,
  apiKey: string,
): Promise<string | null> {
  const { models } = await control.listModels({}, { timeoutMs: 5_000 });
  const placed = models.filter((m) => m.replicasDesired > 0);
  if (placed.length === 0) return "the control plane's catalog";
  for (const m of placed) {
    if (m.replicasReady < m.replicasDesired)
      return `${m.name}: ${m.replicasReady} of ${m.replicasDesired} replicas ready`;
  }
  for (const m of placed) {
    const res = await fetch(`${edgeUrl}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: m.name, messages: [{ role: "user", content: "Hello" }], max_tokens: 1 }),
      signal: AbortSignal.timeout(10_000),
    });
    const body = await res.text();
    if (!res.ok) return `${m.name} through the edge: HTTP ${res.status} ${body.slice(0, 200)}`;
  }
  return null;
}
