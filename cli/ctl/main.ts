import { type Client, Code, ConnectError } from "@connectrpc/connect";
import { parseDuration } from "../../common/duration.ts";
import type { ControlService } from "../../proto/gen/control/v1/control_pb.ts";
import { adminToken, controlClient, DEFAULT_CONTROL_PLANE } from "./client.ts";
import { failure, openCommand } from "./command.ts";
import { nodeJson, nodesCommand } from "./nodes.ts";
import { modelsCommand, replicasCommand } from "./replicas.ts";
import { fetchStatus, formatStatus, statusJson } from "./status.ts";

const HELP = `usage: llmgw ctl <command> [--control-plane URL] [--token-file FILE] [--json]
       llmgw ctl endpoints <set | check | status> …   (talks to the edge: llmgw ctl endpoints --help)

commands:
  status [--watch] [--interval 2s]
                        nodes, replicas, models (and why any cannot run) and the edge's view,
                        on one screen; --watch redraws it in place every interval
  nodes                 nodes with state, GPUs, fabric labels and last heartbeat
  nodes revoke NAME     revoke NAME's certificates (mTLS): its stream is closed, it is lost at
                        once and its replicas are placed elsewhere; it needs a new join token
  node NAME             one node in full (JSON)
  replicas              replicas with state, nodes and ranks, GPUs, ports, load, last failure
  models                the catalog: models, aliases, profiles, ready/desired replicas
  explain MODEL         where each replica of MODEL runs and why, or why it cannot run
  cordon NODE           place nothing new on NODE (kept across control plane restarts)
  uncordon NODE         undo cordon or drain
  drain NODE [--deadline 10m]
                        move NODE's replicas elsewhere, then stop what is left by the deadline
  endpoints set FILE    write a static endpoint list to the edge (router-only mode)
  endpoints check FILE  validate an endpoint list as set would, without writing it
  endpoints status      each model's pool at the edge: saturation, band queues, endpoints' load
  engine-keys rotate    a new secret for the keys engines require; the engines with a key
                        from the old one are replaced one at a time, make before break
  tokens create [--ttl 1h] [--uses 1] [--node NAME [--replace]]
                        a join token for agent enrollment (mTLS), shown once; it enrolls a
                        name that holds no certificate, or only NAME (--node); --replace
                        lets it enroll NAME in place of the node's current certificate,
                        which it revokes

--control-plane defaults to $LLMGW_CONTROL_PLANE, else ${DEFAULT_CONTROL_PLANE}.
The admin token is read from $LLMGW_ADMIN_TOKEN, or from the first line of
--token-file FILE; never from the command line. The endpoints commands talk
to the edge: --edge defaults to $LLMGW_EDGE_URL, else http://127.0.0.1:8787,
and the EdgeSync secret is read from $LLMGW_EDGE_TOKEN.
`;

const FLAGS = {
  "control-plane": { type: "string" },
  json: { type: "boolean" },
  deadline: { type: "string" },
  ttl: { type: "string" },
  uses: { type: "string" },
  node: { type: "string" },
  replace: { type: "boolean" },
  "token-file": { type: "string" },
  watch: { type: "boolean" },
  interval: { type: "string" },
} as const;

type ControlClient = Client<typeof ControlService>;
type Opened = Exclude<ReturnType<typeof openCommand<typeof FLAGS>>, number>;
type Values = Opened["values"];

export async function main(argv: string[]): Promise<number> {
  if (argv[0] === "endpoints") {
    const mod = await import("./endpoints.ts");
    return (await mod.main(argv.slice(1))) ?? 0;
  }
  const opened = openCommand(argv, HELP, FLAGS);
  if (typeof opened === "number") return opened;
  const { command, values, positionals } = opened;
  const url = values["control-plane"] ?? process.env.LLMGW_CONTROL_PLANE ?? DEFAULT_CONTROL_PLANE;
  try {
    const client = controlClient(url, adminToken(values["token-file"]));
    switch (command) {
      case "status":
        return await statusCommand(client, url, positionals, values);
      case "nodes":
        if (positionals[0] === "revoke")
          return await revokeCommand(client, positionals[1], values.json ?? false);
        if (positionals.length > 0) throw new Error(`usage: llmgw ctl nodes [revoke NAME]`);
        process.stdout.write(await nodesCommand(client, values.json ?? false));
        return 0;
      case "node": {
        const name = positionals[0];
        if (!name) throw new Error("usage: llmgw ctl node NAME");
        const { node } = await client.getNode({ name });
        process.stdout.write(`${JSON.stringify(node ? nodeJson(node) : null, null, 2)}\n`);
        return 0;
      }
      case "replicas":
        process.stdout.write(await replicasCommand(client, values.json ?? false));
        return 0;
      case "models":
        process.stdout.write(await modelsCommand(client, values.json ?? false));
        return 0;
      case "explain": {
        const model = positionals[0];
        if (!model) throw new Error("usage: llmgw ctl explain MODEL [--json]");
        const r = await client.explain({ model });
        process.stdout.write(values.json ? `${r.json}\n` : `${r.lines.join("\n")}\n`);
        return 0;
      }
      case "cordon":
      case "uncordon":
      case "drain": {
        const node = positionals[0];
        if (!node) throw new Error(`usage: llmgw ctl ${command} NODE`);
        if (command === "cordon") await client.cordon({ node });
        else if (command === "uncordon") await client.uncordon({ node });
        else {
          const deadlineMs = values.deadline ? parseDuration(values.deadline) : 0;
          await client.drain({ node, deadlineMs });
        }
        process.stdout.write(`${node}: ${command === "drain" ? "draining" : `${command}ed`}\n`);
        return 0;
      }
      case "tokens":
        return await tokensCommand(client, positionals, values);
      case "engine-keys":
        return await engineKeysCommand(client, positionals, values.json ?? false);
      default:
        process.stderr.write(`llmgw ctl: unknown command "${command}"\n\n${HELP}`);
        return 2;
    }
  } catch (err) {
    process.stderr.write(`llmgw ctl ${command}: ${failure(err)} (control plane ${url})\n`);
    return err instanceof ConnectError && err.code === Code.Unauthenticated ? 3 : 1;
  }
}

async function statusCommand(client: ControlClient, url: string, positionals: string[], values: Values) {
  if (positionals.length > 0) throw new Error("usage: llmgw ctl status [--watch] [--interval 2s] [--json]");
  const json = values.json ?? false;
  if (!values.watch) {
    if (values.interval) throw new Error("--interval goes with --watch");
    process.stdout.write(await statusFrame(client, json));
    return 0;
  }
  const every = parseDuration(values.interval ?? "2s");
  if (every < 500) throw new Error("--interval must be at least 500ms");
  return watchStatus(client, url, json, every);
}

async function revokeCommand(client: ControlClient, node: string | undefined, json: boolean) {
  if (!node) throw new Error("usage: llmgw ctl nodes revoke NAME");
  const r = await client.revokeNode({ node });
  if (json) process.stdout.write(`${JSON.stringify({ node, ...r })}\n`);
  else
    process.stdout.write(
      `${node}: revoked ${r.serials.length} certificate${r.serials.length === 1 ? "" : "s"}${r.disconnected ? ", stream closed" : ""}; re-admitting it takes a new join token\n`,
    );
  return 0;
}

async function engineKeysCommand(client: ControlClient, positionals: string[], json: boolean) {
  if (positionals[0] !== "rotate" || positionals.length > 1)
    throw new Error("usage: llmgw ctl engine-keys rotate [--json]");
  const { replicas } = await client.rotateEngineKeys({});
  if (json) process.stdout.write(`${JSON.stringify({ rotated: true, replicas })}\n`);
  else
    process.stdout.write(
      `engine key secret rotated: new placements get keys from the new one; ${replicas.length} replica(s) run with a key from the old one and are replaced one at a time (ctl replicas shows them outdated)${replicas.length > 0 ? `: ${replicas.join(", ")}` : ""}\n`,
    );
  return 0;
}

async function tokensCommand(client: ControlClient, positionals: string[], values: Values) {
  if (positionals[0] !== "create")
    throw new Error(
      "usage: llmgw ctl tokens create [--ttl 1h] [--uses 1] [--node NAME [--replace]] [--json]",
    );
  if (values.replace && !values.node)
    throw new Error("--replace needs --node NAME: the node whose certificate the token replaces");
  const ttlMs = values.ttl ? parseDuration(values.ttl) : 0;
  if (values.ttl && ttlMs <= 0) throw new Error("--ttl must be positive");
  const uses = values.uses === undefined ? 1 : Number(values.uses);
  if (!Number.isInteger(uses) || uses < 1) throw new Error("--uses must be a positive integer");
  const t = await client.createJoinToken({
    ttlMs: BigInt(ttlMs),
    uses,
    node: values.node ?? "",
    replace: values.replace ?? false,
  });
  const expires = new Date(Number(t.expiresAtUnixMs)).toISOString();
  if (values.json) {
    process.stdout.write(
      `${JSON.stringify({ token: t.token, expiresAt: expires, uses: t.uses, caFingerprint: t.caFingerprint })}\n`,
    );
  } else {
    process.stdout.write(`${t.token}\n`);
    process.stderr.write(
      `join token for ${t.uses} enrollment${t.uses === 1 ? "" : "s"}${values.node ? ` of node ${values.node}${values.replace ? ", replacing its current certificate" : ""}` : ""}, valid until ${expires}; it is not shown again.\n` +
        `start an agent with: llmgw agent --control-plane https://HOST:PORT --node ${values.node ?? "NAME"} --join-token ${t.token}\n`,
    );
  }
  return 0;
}

async function statusFrame(client: ControlClient, json: boolean): Promise<string> {
  const s = await fetchStatus(client);
  return json ? `${JSON.stringify(statusJson(s))}\n` : formatStatus(s);
}

/**
 * `ctl status --watch`: the screen redrawn in place (cursor home, clear) until
 * Ctrl-C; with --json one object per line instead. A failed refresh shows
 * its error and the next one tries again, so a control plane restart does
 * not end the watch; a refused token does, since waiting will not fix it.
 */
async function watchStatus(
  client: ControlClient,
  url: string,
  json: boolean,
  everyMs: number,
): Promise<number> {
  for (;;) {
    let frame: string;
    try {
      frame = await statusFrame(client, json);
    } catch (err) {
      if (err instanceof ConnectError && err.code === Code.Unauthenticated) throw err;
      frame = json
        ? `${JSON.stringify({ error: failure(err) })}\n`
        : `llmgw ctl status: ${failure(err)} (control plane ${url})\n`;
    }
    const head = `every ${everyMs / 1000}s: llmgw ctl status (${url})  ${new Date().toISOString()}\n\n`;
    process.stdout.write(json ? frame : `\x1b[H\x1b[J${head}${frame}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
