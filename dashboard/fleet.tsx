import type { Gpu } from "../proto/gen/agent/v1/agent_pb.ts";
import type { Node, Replica } from "../proto/gen/control/v1/control_pb.ts";
import { NodeActions } from "./actions.tsx";
import type { Control } from "./client.ts";
import { duration, gib, since } from "./format.ts";
import { nodeStateName, nodeWord } from "./node-state.ts";

/** Which replica holds each GPU, as `node/index` → replica. */
function gpuHolders(replicas: readonly Replica[]): Map<string, Replica> {
  const out = new Map<string, Replica>();
  for (const r of replicas)
    for (const s of r.shards) for (const i of s.gpuIndices) out.set(`${s.nodeName}/${i}`, r);
  return out;
}

function GpuCell({ node, gpu, holder }: { node: string; gpu: Gpu; holder: Replica | undefined }) {
  const total = Number(gpu.memoryTotalMib);
  const foreign = gpu.foreign.reduce((s, p) => s + Number(p.usedMib), 0);
  const ours = Math.max(0, Number(gpu.memoryUsedMib) - foreign);
  const pct = (mib: number) => `${total > 0 ? (100 * mib) / total : 0}%`;
  return (
    <div class="gpu" data-gpu={`${node}/${gpu.index}`}>
      <span class="gpu-index">GPU{gpu.index}</span>
      <span class="bar" title={`${gib(gpu.memoryUsedMib)} of ${gib(total)} GiB in use`}>
        <span class="bar-ours" style={{ width: pct(ours) }} />
        <span class="bar-foreign" style={{ width: pct(foreign) }} />
      </span>
      <span class="gpu-mem">
        {gib(gpu.memoryUsedMib)}/{gib(total)} GiB
      </span>
      <span class="gpu-holder">
        {holder ? holder.id : "free"}
        {foreign > 0 ? ` + ${gib(foreign)} GiB not llmgw's` : ""}
      </span>
    </div>
  );
}

export function Fleet(props: {
  nodes: readonly Node[];
  replicas: readonly Replica[];
  now: number;
  client: Control;
  onAction: (line: string) => void;
}) {
  const holders = gpuHolders(props.replicas);
  return (
    <section id="fleet">
      <h2>Fleet</h2>
      {props.nodes.length === 0 ? (
        <p class="empty">No node has registered.</p>
      ) : (
        <table>
          <thead>
            <tr>
              <th>Node</th>
              <th>State</th>
              <th>Heartbeat</th>
              <th>Fabric</th>
              <th>GPU memory (in use by replica)</th>
              <th>Actions</th>
            </tr>
          </thead>
          <tbody>
            {props.nodes.map((n) => {
              const word = nodeWord(n);
              const gpus = n.inventory?.gpus ?? [];
              return (
                <tr key={n.name} data-node={n.name} data-state={word}>
                  <td class="name">
                    {n.name}
                    {n.inventory?.simulated ? <span class="tag">simulated</span> : null}
                  </td>
                  <td>
                    <span class={`state state-${word}`}>{word}</span>
                    <div class="sub">
                      {n.draining && n.drainDeadlineUnixMs > 0n
                        ? `deadline in ${duration(Number(n.drainDeadlineUnixMs) - props.now)}`
                        : `${word === nodeStateName(n) ? "" : `${nodeStateName(n)} `}for ${since(n.stateSinceUnixMs, props.now)}`}
                    </div>
                  </td>
                  <td>{n.lastSeenUnixMs > 0n ? `${since(n.lastSeenUnixMs, props.now)} ago` : "-"}</td>
                  <td>
                    {Object.entries(n.fabric).map(([k, v]) => (
                      <span key={k} class="tag">
                        {k}={v}
                      </span>
                    ))}
                  </td>
                  <td class="gpus">
                    {gpus.map((g) => (
                      <GpuCell
                        key={g.index}
                        node={n.name}
                        gpu={g}
                        holder={holders.get(`${n.name}/${g.index}`)}
                      />
                    ))}
                  </td>
                  <td>
                    <NodeActions node={n} client={props.client} onDone={props.onAction} />
                  </td>
                </tr>
              );
            })}
          </tbody>
        </table>
      )}
    </section>
  );
}
