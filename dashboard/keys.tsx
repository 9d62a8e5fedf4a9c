import { expired } from "../common/key-expiry.ts";
import type { KeyUsage } from "../proto/gen/edge/v1/edgesync_pb.ts";
import { type Control, errorText } from "./client.ts";
import { count, day } from "./format.ts";
import { usePoll } from "./poll.ts";

// Usage comes from the edge through the control plane; it changes by the
// request, so a slower poll than the fleet's is enough.
const KEYS_POLL_MS = 5_000;

export function Keys({ client }: { client: Control }) {
  const { data, error } = usePoll(async () => (await client.getKeyUsage({})).usage, KEYS_POLL_MS);
  return (
    <section id="keys">
      <h2>Keys</h2>
      {error ? <p class="error">Key usage: {errorText(error)}</p> : null}
      {data && data.length === 0 ? <p class="empty">No API key exists.</p> : null}
      {data && data.length > 0 ? <KeyTable usage={data} /> : null}
    </section>
  );
}

function KeyTable({ usage }: { usage: readonly KeyUsage[] }) {
  return (
    <table>
      <thead>
        <tr>
          <th>Key</th>
          <th>Requests</th>
          <th>Prompt tokens</th>
          <th>Completion tokens</th>
          <th>Cut short</th>
          <th title="Requests charged the edge's estimate: the engine reported no usage">Estimated</th>
          <th>Budget</th>
        </tr>
      </thead>
      <tbody>
        {usage.map((u) => (
          <tr key={u.keyId} data-key={u.keyId}>
            <td class="name">
              {u.name || u.keyId}
              <div class="sub">
                {u.keyId}
                {u.revoked ? " · revoked" : ""}
                {expiry(u.expiresAtUnixMs, Date.now())}
              </div>
            </td>
            <td>{count(u.requests)}</td>
            <td>{count(u.promptTokens)}</td>
            <td>{count(u.completionTokens)}</td>
            <td>{count(u.partialRequests)}</td>
            <td>
              {u.estimatedRequests > 0n
                ? `${count(u.estimatedRequests)} · ${count(u.estimatedTokens)} tokens`
                : "none"}
            </td>
            <td>{u.budgetTokens > 0n ? `${count(u.budgetUsed)} / ${count(u.budgetTokens)}` : "none"}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

/** " · expires <day>" for a key with an expiry, " · expired" once it has passed. */
function expiry(unixMs: bigint, now: number): string {
  if (unixMs === 0n) return "";
  return expired({ expires_at_unix_ms: Number(unixMs) }, now)
    ? " · expired"
    : ` · expires ${day(Number(unixMs))}`;
}
