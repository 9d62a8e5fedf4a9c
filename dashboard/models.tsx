import type { ModelSummary } from "../proto/gen/control/v1/control_pb.ts";

/**
 * Ready over desired per model (desired moves between min and max for a
 * model that scales, with the scaling stage's reason under it); for one short of its replicas, the
 * placement explanation: the lines `llmgw ctl explain` prints, from the same
 * Explain call.
 */
export function Models(props: {
  models: readonly ModelSummary[];
  explanations: ReadonlyMap<string, string[]>;
}) {
  return (
    <section id="models">
      <h2>Models</h2>
      {props.models.length === 0 ? (
        <p class="empty">The catalog is empty.</p>
      ) : (
        <table>
          <thead>
            <tr>
              <th>Model</th>
              <th>Ready / desired</th>
              <th>Routing</th>
              <th>Profiles</th>
            </tr>
          </thead>
          <tbody>
            {props.models.map((m) => {
              const lines = props.explanations.get(m.name);
              const short = !m.routerOnly && m.replicasReady < m.replicasDesired;
              return (
                <tr
                  key={m.name}
                  data-model={m.name}
                  data-ready={m.replicasReady}
                  data-desired={m.replicasDesired}
                >
                  <td class="name">
                    {m.name}
                    {m.aliases.length > 0 ? <div class="sub">alias {m.aliases.join(", ")}</div> : null}
                  </td>
                  <td>
                    {m.routerOnly ? (
                      <span class="sub">router only</span>
                    ) : (
                      <span class={short ? "state state-short" : "state state-ready"}>
                        {m.replicasReady} / {m.replicasDesired}
                      </span>
                    )}
                    {!m.routerOnly && m.replicasMax > m.replicasMin ? (
                      <div class="sub scaling" data-min={m.replicasMin} data-max={m.replicasMax}>
                        scales {m.replicasMin}..{m.replicasMax}
                        {m.scaling ? `: ${m.scaling}` : ""}
                      </div>
                    ) : null}
                    {lines ? <pre class="explain">{lines.join("\n")}</pre> : null}
                  </td>
                  <td>{m.routing}</td>
                  <td>{m.profiles.join(", ")}</td>
                </tr>
              );
            })}
          </tbody>
        </table>
      )}
    </section>
  );
}
