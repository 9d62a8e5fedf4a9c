import { useEffect, useMemo, useState } from "preact/hooks";
import { ActionLog } from "./actions.tsx";
import { type Control, controlClient, errorText, isUnauthenticated } from "./client.ts";
import { Edge } from "./edge.tsx";
import { Fleet } from "./fleet.tsx";
import { duration } from "./format.ts";
import { Keys } from "./keys.tsx";
import { Models } from "./models.tsx";
import { Panel } from "./panel.tsx";
import { usePoll } from "./poll.ts";
import { Replicas } from "./replicas.tsx";

/** Nodes, replicas and models are read together every 1.5 s (issue 16: at most 2 s). */
const FLEET_POLL_MS = 1_500;

async function fleetSnapshot(client: Control) {
  const [{ nodes }, { replicas }, { models }] = await Promise.all([
    client.listNodes({}),
    client.listReplicas({}),
    client.listModels({}),
  ]);
  const short = models.filter((m) => !m.routerOnly && m.replicasReady < m.replicasDesired);
  const explanations = new Map(
    await Promise.all(
      short.map(async (m) => [m.name, (await client.explain({ model: m.name })).lines] as const),
    ),
  );
  return { nodes, replicas, models, explanations };
}

export function Dashboard(props: { token: string; onSignOut: (why: string | null) => void }) {
  const client = useMemo(() => controlClient(props.token), [props.token]);
  const fleet = usePoll(() => fleetSnapshot(client), FLEET_POLL_MS);
  const [actions, setActions] = useState<{ at: number; line: string }[]>([]);
  const { onSignOut } = props;
  useEffect(() => {
    if (fleet.error && isUnauthenticated(fleet.error))
      onSignOut(`The control plane refused the admin token: ${errorText(fleet.error)}`);
  }, [fleet.error, onSignOut]);
  const onAction = (line: string) => setActions((l) => [{ at: Date.now(), line }, ...l].slice(0, 20));
  const data = fleet.data;
  return (
    <main>
      <header>
        <h1>llmgw</h1>
        <span class="sub" id="updated">
          {fleet.at > 0 ? `updated ${duration(Date.now() - fleet.at)} ago` : "loading…"}
        </span>
        <button type="button" id="sign-out" onClick={() => onSignOut(null)}>
          Sign out
        </button>
      </header>
      {fleet.error ? (
        <p class="error" role="alert">
          The control plane did not answer: {errorText(fleet.error)}. Showing what it said last.
        </p>
      ) : null}
      {data ? (
        <>
          <Panel id="fleet" title="Fleet">
            <Fleet
              nodes={data.nodes}
              replicas={data.replicas}
              now={fleet.at}
              client={client}
              onAction={onAction}
            />
          </Panel>
          <Panel id="replicas" title="Replicas">
            <Replicas replicas={data.replicas} now={fleet.at} />
          </Panel>
          <Panel id="models" title="Models">
            <Models models={data.models} explanations={data.explanations} />
          </Panel>
        </>
      ) : null}
      <Panel id="edge" title="Edge">
        <Edge client={client} />
      </Panel>
      <Panel id="keys" title="Keys">
        <Keys client={client} />
      </Panel>
      <Panel id="actions" title="Actions">
        <ActionLog lines={actions} />
      </Panel>
    </main>
  );
}
