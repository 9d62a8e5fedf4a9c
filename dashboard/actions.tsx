import { useState } from "preact/hooks";
import type { Node } from "../proto/gen/control/v1/control_pb.ts";
import { type Control, errorText } from "./client.ts";
import { clock } from "./format.ts";

type Action = "cordon" | "uncordon" | "drain";

// What each action does, in the words of docs/operating.md, for the confirmation.
const CONSEQUENCE: Record<Action, string> = {
  cordon: "No new replica will be placed on it; what runs there keeps running.",
  uncordon: "Ends the cordon or drain: replicas may be placed on it again.",
  drain:
    "It is cordoned, replacements are placed elsewhere where there is room, then its replicas stop here; whatever is still there after 10 minutes is stopped anyway.",
};

async function run(client: Control, action: Action, node: string): Promise<void> {
  if (action === "cordon") await client.cordon({ node });
  else if (action === "uncordon") await client.uncordon({ node });
  else await client.drain({ node });
}

/** Cordon, uncordon and drain for one node, each behind a confirmation. */
export function NodeActions(props: { node: Node; client: Control; onDone: (line: string) => void }) {
  const [asking, setAsking] = useState<Action | null>(null);
  const [busy, setBusy] = useState(false);
  const { node } = props;
  const offered: Action[] = [node.cordoned || node.draining ? "uncordon" : "cordon"];
  if (!node.draining) offered.push("drain");
  const confirm = async (action: Action) => {
    setBusy(true);
    try {
      await run(props.client, action, node.name);
      props.onDone(`${action} ${node.name}: done`);
    } catch (err) {
      props.onDone(`${action} ${node.name} failed: ${errorText(err)}`);
    } finally {
      setBusy(false);
      setAsking(null);
    }
  };
  return (
    <div class="actions">
      {offered.map((a) => (
        <button key={a} type="button" data-action={a} disabled={busy} onClick={() => setAsking(a)}>
          {a}
        </button>
      ))}
      {asking ? (
        <div class="overlay">
          <div class="dialog" role="dialog" aria-modal="true" aria-labelledby="confirm-title">
            <h3 id="confirm-title">
              {asking[0]!.toUpperCase() + asking.slice(1)} {node.name}?
            </h3>
            <p>{CONSEQUENCE[asking]}</p>
            <div class="dialog-buttons">
              <button type="button" data-confirm={asking} disabled={busy} onClick={() => confirm(asking)}>
                {asking} {node.name}
              </button>
              <button type="button" disabled={busy} onClick={() => setAsking(null)}>
                Cancel
              </button>
            </div>
          </div>
        </div>
      ) : null}
    </div>
  );
}

/** The Actions panel: what this page did, newest first, with the server's answer. */
export function ActionLog(props: { lines: readonly { at: number; line: string }[] }) {
  return (
    <section id="actions">
      <h2>Actions</h2>
      <p class="hint">Cordon, uncordon and drain are on each node's row in Fleet, each asking first.</p>
      {props.lines.length === 0 ? (
        <p class="empty">Nothing done from this page yet.</p>
      ) : (
        <ul class="log">
          {props.lines.map((l) => (
            <li key={l.at}>
              <time>{clock(l.at)}</time> {l.line}
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}
