import { shardStateFromWire } from "../common/shard-state.ts";
import type { Replica, ShardPlacement } from "../proto/gen/control/v1/control_pb.ts";
import { duration, percent, since } from "./format.ts";

function Load({ shard }: { shard: ShardPlacement }) {
  const l = shard.load;
  if (!l || l.scrapedAtUnixMs === 0n) return <span class="sub">no load yet</span>;
  return (
    <span class="load">
      {l.waiting} waiting · {l.running} running · KV {percent(l.kvUsage)}
    </span>
  );
}

function LastTransition({ r, now }: { r: Replica; now: number }) {
  const f = r.lastFailure;
  const next = r.nextAttemptUnixMs > 0n ? Number(r.nextAttemptUnixMs) - now : 0;
  return (
    <div>
      <span class={`state state-${r.state}`}>{r.state}</span>
      <span class="sub"> for {since(r.sinceUnixMs, now)}</span>
      {r.restarts > 0 ? <span class="sub"> · {r.restarts} restarts</span> : null}
      {next > 0 ? <span class="sub"> · next attempt in {duration(next)}</span> : null}
      {r.outdated ? <div class="outdated">runs an older spec: {r.outdated}</div> : null}
      {f ? (
        <details class="failure">
          <summary>
            last failure {since(f.atUnixMs, now)} ago: {f.reason}
            {f.hasExitCode ? ` (exit ${f.exitCode})` : ""}
          </summary>
          <pre>{f.outputTail.length > 0 ? f.outputTail.join("\n") : "(no output)"}</pre>
        </details>
      ) : null}
    </div>
  );
}

export function Replicas({ replicas, now }: { replicas: readonly Replica[]; now: number }) {
  return (
    <section id="replicas">
      <h2>Replicas</h2>
      {replicas.length === 0 ? (
        <p class="empty">No replica is placed.</p>
      ) : (
        <table>
          <thead>
            <tr>
              <th>Replica</th>
              <th>Model / profile</th>
              <th>State</th>
              <th>Shards: node, rank, GPUs, live load</th>
            </tr>
          </thead>
          <tbody>
            {replicas.map((r) => (
              <tr
                key={r.id}
                data-replica={r.id}
                data-model={r.model}
                data-state={r.state}
                data-outdated={r.outdated ? "true" : "false"}
              >
                <td class="name">{r.id}</td>
                <td>
                  {r.model}
                  <div class="sub">{r.profile}</div>
                </td>
                <td>
                  <LastTransition r={r} now={now} />
                </td>
                <td>
                  {r.shards.map((s) => (
                    <div key={s.rank} class="shard" data-node={s.nodeName}>
                      <span class="name">{s.nodeName}</span> rank {s.rank} · GPU {s.gpuIndices.join(",")} ·{" "}
                      {shardStateFromWire(s.state) ?? "unspecified"} · <Load shard={s} />
                    </div>
                  ))}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}
