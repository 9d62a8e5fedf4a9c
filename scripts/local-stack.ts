/**
 * `npm start`: the whole local stack on loopback — the edge in workerd
 * (scripts/local-stack/edge.ts), a control plane, and two agents with
 * simulated GPUs whose engines are sim engines launched through the real
 * vLLM adapter; with `--sites N`, N such control planes with their agents,
 * each a site of its own behind the one edge (scripts/local-stack/sites.ts) —
 * with every process's log prefixed on this terminal. It creates an API key and
 * prints how to call the edge once a request through it succeeds. Ctrl-C
 * stops everything, engines included, and waits until it has.
 *
 * Run as `node --import tsx` (package.json), not under tsx's CLI: a
 * terminal's Ctrl-C reaches every process of the foreground group at once,
 * and tsx's CLI SIGKILLs a script that does not acknowledge the signal
 * within tens of milliseconds, which under load cut this script's clean-up
 * short and left engines running.
 */
import { type ChildProcess, execFile, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { groupAlive } from "../agent/engine-process.ts";
import { killEngines } from "../agent/kill-engines.ts";
import { controlClient } from "../cli/ctl/client.ts";
import { edgeSyncClient } from "../common/edgesync-client.ts";
import { errorMessage } from "../common/log.ts";
import { banner } from "./local-stack/banner.ts";
import { retireOtherSites, sitesAwaiting } from "./local-stack/edge-sites.ts";
import { parseStackOptions, STACK_HELP, type StackOptions } from "./local-stack/options.ts";
import { portProblem, type StackPort } from "./local-stack/ports.ts";
import { awaiting } from "./local-stack/ready.ts";
import { type StackSite, siteTokensSecret, stackSitePreference, stackSites } from "./local-stack/sites.ts";

const REPO = join(import.meta.dirname, "..");
const LLMGW = join(REPO, "bin", "llmgw.mjs");
const EDGE_SERVER = join(REPO, "scripts", "local-stack", "edge.ts");
/** How long children get to exit after SIGTERM (agents stop their engines first) before SIGKILL. */
const CHILD_GRACE_MS = 20_000;
const READY_DEADLINE_MS = 120_000;
/** npm relays the terminal's Ctrl-C, so one keypress arrives twice: only a later signal forces. */
const SAME_INTERRUPT_MS = 1_000;

let opts: StackOptions;
try {
  const parsed = parseStackOptions(process.argv.slice(2), REPO);
  if (parsed === "help") {
    process.stdout.write(STACK_HELP);
    process.exit(0);
  }
  opts = parsed;
} catch (err) {
  process.stderr.write(`npm start: ${errorMessage(err)}\n\n${STACK_HELP}`);
  process.exit(2);
}

// Each site's admin token (ControlService requires it) is made once per
// state directory and kept there (0600), so a shell that exported it stays
// valid across starts.
const SITES = stackSites(opts);
const EDGE = `http://127.0.0.1:${opts.edgePort}`;
// The EdgeSync secret and the API key the banner prints are kept there too,
// like the admin token: a shell that exported LLMGW_EDGE_TOKEN, or a client
// configured with the key, keeps working across starts.
const EDGE_TOKEN_FILE = join(opts.stateDir, "edge.token");
const API_KEY_FILE = join(opts.stateDir, "local-dev.key");
mkdirSync(opts.stateDir, { recursive: true });
const TOKEN = keptSecret(EDGE_TOKEN_FILE, () => randomBytes(24).toString("base64url"));
const env = { ...process.env, LLMGW_EDGE_TOKEN: TOKEN };
/** A site's own EdgeSync token, kept like the edge's; the edge's for the site that holds it. */
function edgeTokenOf(site: StackSite): string {
  if (!site.siteTokenFile) return TOKEN;
  mkdirSync(join(site.siteTokenFile, ".."), { recursive: true });
  return keptSecret(site.siteTokenFile, () => randomBytes(24).toString("base64url"));
}
// The edge knows every site's token (EDGE_SYNC_SITE_TOKENS), from the
// environment like its own, never argv.
// With several sites it also honours the x-llmgw-location header in place
// of Cloudflare's request.cf, so a local client can say where it is.
const edgeEnv =
  SITES.length > 1
    ? { ...env, LLMGW_EDGE_SITE_TOKENS: siteTokensSecret(SITES, edgeTokenOf), LLMGW_LOCATION_HEADER: "1" }
    : env;

/**
 * A site's control plane: its addresses follow the flags (LLMGW_ overrides
 * of infra/local/llmgw.yaml; the defaults are the file's values), and a
 * site other than the default one names itself and holds its EdgeSync token.
 */
function controlEnv(site: StackSite): NodeJS.ProcessEnv {
  return {
    ...env,
    LLMGW_EDGE_TOKEN: edgeTokenOf(site),
    LLMGW_AGENT_LISTEN: `127.0.0.1:${site.agentPort}`,
    LLMGW_ADMIN_LISTEN: `127.0.0.1:${site.adminPort}`,
    LLMGW_DATA_DIR: site.dataDir,
    LLMGW_ADMIN__TOKEN_FILE: site.adminTokenFile,
    LLMGW_EDGE__URL: EDGE,
    ...(site.name === "default" ? {} : { LLMGW_SITE: site.name }),
    // Every site's config says the same; site-a, with the edge's token, is the one that publishes it.
    ...(SITES.length > 1 ? { LLMGW_ROUTER__SITES: JSON.stringify(stackSitePreference(SITES)) } : {}),
    // Sites' engines listen on their nodes' own addresses: each site may hand out the same ports.
    ...(opts.enginePorts ? { LLMGW_CONTROL__PORT_RANGE: `[${opts.enginePorts.join(", ")}]` } : {}),
  };
}
const children: ChildProcess[] = [];
let up = false;
let stopping: Promise<never> | undefined;
let abortStart: (err: Error) => void = () => {};
const startAborted = new Promise<never>((_, reject) => {
  abortStart = reject;
});
startAborted.catch(() => {});

const say = (text: string) => process.stdout.write(text);
const exited = (c: ChildProcess) => c.exitCode !== null || c.signalCode !== null;

function start(name: string, args: string[], color: number, childEnv: NodeJS.ProcessEnv = env): ChildProcess {
  // A Ctrl-C during start-up has already signalled every child there was;
  // one started after it would be left running.
  if (stopping) throw new Error("stopping");
  const child = spawn(process.execPath, args, {
    cwd: REPO,
    env: childEnv,
    stdio: ["ignore", "pipe", "pipe"],
  });
  const prefix = `\x1b[${color}m${name.padEnd(SITES.length > 1 ? 12 : 10)}\x1b[0m `;
  const forward = (buf: Buffer) => {
    if (opts.quiet) return;
    for (const line of buf.toString().split("\n")) if (line.trim()) say(`${prefix}${line}\n`);
  };
  child.stdout!.on("data", forward);
  child.stderr!.on("data", forward);
  child.on("exit", (code, signal) => {
    if (stopping) return;
    say(`${prefix}exited (${signal ?? code})\n`);
    if (!up) abortStart(new Error(`${name} exited (${signal ?? code}) before the stack was up`));
  });
  children.push(child);
  return child;
}

function waitForLine(child: ChildProcess, pattern: RegExp, what: string, timeoutMs = 90_000): Promise<void> {
  return new Promise((resolve, reject) => {
    let seen = "";
    const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), timeoutMs);
    const check = (buf: Buffer) => {
      seen = (seen + buf.toString()).slice(-10_000);
      if (pattern.test(seen)) {
        clearTimeout(timer);
        resolve();
      }
    };
    child.stdout!.on("data", check);
    child.stderr!.on("data", check);
  });
}

/** Polls `probe` (null: done; else what it still waits for) until done or the deadline. */
async function waitFor(probe: () => Promise<string | null>, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const left = await probe().catch((err: unknown) => errorMessage(err));
    if (left === null) return;
    if (Date.now() > deadline) throw new Error(`not ready within ${timeoutMs / 1000} s: waiting for ${left}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** Resolves with the children still running after `ms`. */
async function exitWithin(procs: ChildProcess[], ms: number): Promise<ChildProcess[]> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  await Promise.race([
    Promise.all(procs.map((c) => (exited(c) ? null : new Promise((r) => c.once("exit", r))))),
    new Promise((r) => (timer = setTimeout(r, ms))),
  ]);
  clearTimeout(timer);
  return procs.filter((c) => !exited(c));
}

/** SIGKILLs engines an agent left running (it died before stopping them) and waits until they are gone. */
async function killLeftEngines(): Promise<void> {
  const left = SITES.flatMap((s) => killEngines(s.agentsDir));
  if (left.length === 0) return;
  // Their records stay in the agents' state files: stopped by nobody who
  // could record it, they count as crashes when the agents next start.
  say(`killed ${left.length} engine(s) an agent left running\n`);
  const deadline = Date.now() + 5_000;
  while (left.some(groupAlive) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
}

/**
 * SIGTERM to every child — the agents run with --stop-engines-on-exit, so
 * each stops its engines and forgets them, and the next start counts no
 * crash — then wait for all of them (and any engine left) to be gone.
 */
function stop(code: number): Promise<never> {
  stopping ??= (async () => {
    say("\nstopping the local stack…\n");
    for (const c of children) if (!exited(c)) c.kill("SIGTERM");
    const late = await exitWithin(children, CHILD_GRACE_MS);
    for (const c of late) c.kill("SIGKILL");
    await exitWithin(late, 5_000);
    await killLeftEngines();
    say("stopped\n");
    process.exit(code);
  })();
  return stopping;
}

/** A second Ctrl-C: no more waiting. */
function force(): void {
  say("\nforced: killing every process of the stack\n");
  for (const c of children) if (!exited(c)) c.kill("SIGKILL");
  for (const s of SITES) killEngines(s.agentsDir);
  process.exit(130);
}

let firstSignalAt = 0;
function onSignal(): void {
  if (firstSignalAt === 0) {
    firstSignalAt = Date.now();
    void stop(0);
  } else if (Date.now() - firstSignalAt > SAME_INTERRUPT_MS) force();
}
process.on("SIGINT", onSignal);
process.on("SIGTERM", onSignal);
process.on("SIGHUP", onSignal);
// When whatever started us goes away without a signal reaching us (npm
// killed by a supervisor, a closed terminal), we are re-parented: stop too,
// rather than leave a fleet running nobody can see.
const parent = process.ppid;
setInterval(() => {
  if (process.ppid !== parent) void stop(0);
}, 1_000).unref();

/**
 * The key's requests in flight at once (README): one client holding
 * hundreds of streams gets 429s beyond this rather than queueing them all
 * on two simulated nodes.
 */
const LOCAL_MAX_CONCURRENT = "32";

async function createKey(): Promise<string> {
  const { stdout } = await promisify(execFile)(
    process.execPath,
    [
      LLMGW,
      "keys",
      "create",
      "--name",
      "local-dev",
      "--band",
      "platinum",
      "--max-concurrent",
      LOCAL_MAX_CONCURRENT,
      "--edge",
      EDGE,
      "--json",
    ],
    { cwd: REPO, env },
  ).catch((err: { stderr?: string }) => {
    throw new Error(`creating the API key failed: ${err.stderr ?? errorMessage(err)}`);
  });
  return (JSON.parse(stdout) as { secret: string }).secret;
}

/** A secret made once per state directory and kept in `file` (0600). */
function keptSecret(file: string, make: () => string): string {
  if (!existsSync(file)) writeFileSync(file, `${make()}\n`, { mode: 0o600 });
  return readFileSync(file, "utf8").trim();
}

/**
 * The `local-dev` key of this state directory, made on the first start. The
 * edge keeps keys in its KV under the same directory, so the kept one still
 * works — unless the edge's state alone was deleted: then a new one.
 */
async function apiKey(): Promise<string> {
  if (existsSync(API_KEY_FILE)) {
    const kept = readFileSync(API_KEY_FILE, "utf8").trim();
    const res = await fetch(`${EDGE}/v1/models`, { headers: { authorization: `Bearer ${kept}` } });
    await res.body?.cancel();
    if (res.status !== 401) return kept;
  }
  const secret = await createKey();
  writeFileSync(API_KEY_FILE, `${secret}\n`, { mode: 0o600 });
  return secret;
}

/** The listeners `npm start` checks before it starts anything, each with the flag that moves it. */
function stackPorts(): StackPort[] {
  const ports: StackPort[] = [{ port: opts.edgePort, what: "the edge", flag: "--edge-port" }];
  for (const s of SITES) {
    const whose = s.name === "default" ? "the control plane's" : `site ${s.name}'s control plane's`;
    ports.push(
      { port: s.adminPort, what: `${whose} admin API`, flag: "--admin-port" },
      { port: s.agentPort, what: `${whose} agent listener`, flag: "--agent-port" },
    );
  }
  return ports;
}

/** A site's control plane and, once it listens, its agents; resolves when they are started. */
async function startSite(site: StackSite, colors: { control: number; nodes: number }): Promise<void> {
  mkdirSync(site.agentsDir, { recursive: true });
  const cp = start(
    `${site.tag}control`,
    [LLMGW, "server", "--config", "infra/local/llmgw.yaml"],
    colors.control,
    controlEnv(site),
  );
  await waitForLine(cp, /control plane listening/, `${site.tag}the control plane`);
  for (const [i, node] of site.nodes.entries()) {
    start(
      `${site.tag}${node.name}`,
      [
        LLMGW,
        "agent",
        "--control-plane",
        `http://127.0.0.1:${site.agentPort}`,
        "--node",
        node.name,
        "--simulate-gpus",
        "8xH100-80GB",
        "--fabric",
        "ib=local-island",
        // Each simulated node has its own loopback address, so engines on
        // the two "nodes" can use the same ports as on real machines.
        "--advertise-address",
        node.address,
        "--state-dir",
        join(site.agentsDir, node.name),
        "--vllm-bin",
        "test/bin/vllm",
        // The stack owns its engines: Ctrl-C stops them, deliberately, so
        // the next start finds nothing to count as a crash.
        "--stop-engines-on-exit",
      ],
      colors.nodes + i,
    );
  }
}

async function main(): Promise<void> {
  const taken = await portProblem(stackPorts());
  if (taken) {
    process.stderr.write(`npm start: ${taken}\n`);
    process.exit(1);
  }
  const tokens = SITES.map((s) => {
    mkdirSync(join(s.adminTokenFile, ".."), { recursive: true });
    return keptSecret(s.adminTokenFile, () => randomBytes(32).toString("hex"));
  });
  await killLeftEngines(); // leftovers of a run that was killed hard
  const until = <T>(p: Promise<T>) => Promise.race([p, startAborted]);

  const edge = start(
    "edge",
    ["--import", "tsx", EDGE_SERVER, "--port", String(opts.edgePort), "--state-dir", opts.stateDir],
    35,
    edgeEnv,
  );
  // The agents need only their control plane: their engines start while
  // the edge still bundles and loads, and each control plane publishes to
  // the edge once it answers.
  const edgeReady = waitForLine(edge, /edge ready on http/, "the edge");
  edgeReady.catch(() => {});
  await until(Promise.all(SITES.map((s) => startSite(s, { control: 36, nodes: 32 }))));

  await until(edgeReady);
  const sync = edgeSyncClient(EDGE, TOKEN);
  const retired = await until(
    retireOtherSites(
      sync,
      SITES.map((s) => s.name),
    ),
  );
  if (retired.length > 0)
    say(`emptied the endpoint sets a previous start left at the edge for: ${retired.join(", ")}\n`);
  const secret = await until(apiKey());
  say("\nwaiting for the replicas to be placed, ready and reachable through the edge…\n");
  const controls = SITES.map((s, i) => controlClient(`http://127.0.0.1:${s.adminPort}`, tokens[i]!));
  await until(
    waitFor(async () => {
      for (const [i, control] of controls.entries()) {
        const left = await awaiting(control, EDGE, secret);
        if (left) return SITES.length > 1 ? `${SITES[i]!.name}: ${left}` : left;
      }
      return SITES.length > 1
        ? sitesAwaiting(
            sync,
            SITES.map((s) => s.name),
          )
        : null;
    }, READY_DEADLINE_MS),
  );
  up = true;
  say(
    banner({
      edge: EDGE,
      sites: SITES,
      adminTokens: tokens,
      apiKey: secret,
      edgeTokenFile: EDGE_TOKEN_FILE,
      apiKeyFile: API_KEY_FILE,
      quiet: opts.quiet,
    }),
  );
}

main().catch((err) => {
  if (stopping) return;
  process.stderr.write(`npm start: ${errorMessage(err)}\n`);
  void stop(1);
});
