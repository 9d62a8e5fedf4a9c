import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { chmodSync, cpSync, existsSync, mkdirSync, readFileSync, realpathSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { promisify } from "node:util";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { controlClient } from "../../cli/ctl/client.ts";
import { type Installed, packAndInstall } from "../../scripts/pack-install.ts";
import {
  engineKeyOf,
  killProcessesMatching,
  loopbackAddress,
  processArgv,
  processRunning,
  startAgent,
  startControlPlane,
  tempDir,
} from "../harness/fleet.ts";
import { freePort, freePortBlock, REPO, waitUntil } from "../harness/process.ts";
import { startPrivateManager, type UnitManager, whyNoManager } from "./systemd.ts";

// The production install, end to end: `npm pack`, the tarball installed
// with --omit=dev into an empty project, and a fleet run from there — first
// as plain processes, then under the shipped systemd units. A tag unique to
// this run is part of the model source, so every engine this file started
// can be found in /proc and killed at the end.
const run = promisify(execFile);
const TAG = randomUUID().slice(0, 8);
const SOURCE = `sim-org/install-${TAG}`;
const MODEL = "install-demo";
const REPLICA = `${MODEL}/1gpu/0`;
const PKG = JSON.parse(readFileSync(join(REPO, "package.json"), "utf8")) as {
  dependencies: Record<string, string>;
  devDependencies: Record<string, string>;
};

/** The control and model sections; the listen addresses and data_dir go before them. */
/** The models, and `control.port_range` when the control plane is not started by startControlPlane (which sets it). */
function modelsConfig(ports?: number[]): string {
  return `control:
  interval: 1s
  startup_grace: 1s
${ports ? `  port_range: [${ports[0]}, ${ports.at(-1)}]\n` : ""}models:
  - name: ${MODEL}
    profiles:
      - name: 1gpu
        engine: sim
        source: ${SOURCE}
        engine_args: ["--max-model-len", "8192"]
        startup_deadline: 45s
        stop_grace: 2s
`;
}

async function readyReplica(adminUrl: string) {
  const client = controlClient(adminUrl);
  return waitUntil(
    `${REPLICA} ready`,
    async () => {
      const { replicas } = await client.listReplicas({});
      const r = replicas.find((x) => x.id === REPLICA);
      const pid = r?.shards[0]?.pid ?? 0;
      return r?.state === "ready" && pid ? r : undefined;
    },
    60_000,
    200,
  );
}

let dir: string;
let installed: Installed;

beforeAll(async () => {
  dir = tempDir("install");
  installed = await packAndInstall(dir);
}, 240_000);

afterAll(() => {
  killProcessesMatching(SOURCE);
});

describe("npm pack, then npm install --omit=dev", () => {
  it("packs the compiled program, the dashboard's bundle and the infra examples: no TypeScript sources, tests or docs", () => {
    const outside = installed.files.filter(
      (f) =>
        !/^(package\.json|README\.md|bin\/llmgw\.mjs|dist\/.+\.(js|mjs|json)|dist\/dashboard\/build\/(index\.html|app\.css)|infra\/(systemd|cloudflared|examples)\/.+)$/.test(
          f,
        ),
    );
    expect(outside).toEqual([]);
    for (const f of [
      "dist/cli/llmgw.js",
      "dist/bin/llmgw.mjs",
      "dist/dashboard/build/index.html",
      "dist/dashboard/build/app.js",
      "dist/dashboard/build/app.css",
      "infra/systemd/llmgw-agent.service",
    ]) {
      expect(installed.files).toContain(f);
    }
  });

  it("installs the runtime dependencies and none of the dev tooling", () => {
    const has = (name: string) => existsSync(join(installed.app, "node_modules", name, "package.json"));
    expect(Object.keys(PKG.dependencies).filter((d) => !has(d))).toEqual([]);
    // tsx, typescript, wrangler, vitest, the pinned Node, ... and esbuild, which tsx would pull in.
    expect([...Object.keys(PKG.devDependencies), "esbuild"].filter(has)).toEqual([]);
  });

  it("loads every subcommand from the install", async () => {
    const help = await run(process.execPath, [installed.bin, "--help"]);
    const commands = [...help.stdout.matchAll(/^ {2}(\S+)/gm)].map((m) => m[1]!);
    expect(commands).toEqual(expect.arrayContaining(["server", "agent", "ctl", "sim-engine"]));
    for (const c of commands) {
      const r = await run(process.execPath, [installed.bin, c, "--help"]).catch((e: Error) => e);
      expect(r instanceof Error ? `${c}: ${r.message}` : "", c).toBe("");
    }
  });

  it("runs a control plane, an agent with simulated GPUs and a sim engine from the install; the replica goes ready", async () => {
    const cp = await startControlPlane(modelsConfig(), { entry: installed.bin });
    const node = "install-node";
    const agent = startAgent(cp, node, { entry: installed.bin });
    try {
      const adminUrl = cp.adminUrl;
      const replica = await readyReplica(adminUrl);
      const pid = replica.shards[0]!.pid;

      // The installed control plane serves the dashboard from the package's bundle.
      const page = await fetch(`${adminUrl}/`);
      expect(page.status).toBe(200);
      expect(await page.text()).toContain('<script type="module" src="app.js">');
      expect((await fetch(`${adminUrl}/app.js`)).status).toBe(200);

      // The engine is the installed package's own sim engine.
      const argv = processArgv(pid)!;
      expect(argv.slice(1, 4)).toEqual([
        join(installed.root, "dist", "bin", "llmgw.mjs"),
        "sim-engine",
        "serve",
      ]);
      const engine = new OpenAI({
        baseURL: `http://${loopbackAddress(node)}:${replica.shards[0]!.ports!.http}/v1`,
        // Past the edge, as only a test does: with the key the agent launched the engine with.
        apiKey: engineKeyOf(join(cp.dir, "agents", node), REPLICA),
        maxRetries: 0,
      });
      const chat = await engine.chat.completions.create({
        model: MODEL,
        messages: [{ role: "user", content: "Hello" }],
        max_tokens: 4,
      });
      expect(chat.usage?.completion_tokens).toBeGreaterThan(0);

      const ctl = await run(process.execPath, [
        installed.bin,
        "ctl",
        "replicas",
        "--json",
        "--control-plane",
        adminUrl,
      ]);
      const listed = JSON.parse(ctl.stdout) as { id: string; state: string }[];
      expect(listed.find((r) => r.id === REPLICA)?.state).toBe("ready");
    } finally {
      await agent.kill();
      await cp.proc.kill();
      killProcessesMatching(SOURCE);
    }
  }, 120_000);
});

describe("the systemd units", () => {
  const analyze = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"].find((p) => existsSync(p));

  it.skipIf(!analyze)(
    `pass systemd-analyze verify with no warning${analyze ? "" : " (skipped: systemd-analyze is not installed)"}`,
    async () => {
      // A root of their own, as installed: the units in /etc, stand-ins for
      // the executables they name, the host's targets they order against.
      const root = join(dir, "verify-root");
      mkdirSync(join(root, "etc", "systemd", "system"), { recursive: true });
      mkdirSync(join(root, "usr", "lib", "systemd"), { recursive: true });
      mkdirSync(join(root, "bin"));
      mkdirSync(join(root, "usr", "bin"));
      const hostUnits = ["/usr/lib/systemd/system", "/lib/systemd/system"].find((p) => existsSync(p))!;
      cpSync(hostUnits, join(root, "usr", "lib", "systemd", "system"), { recursive: true });
      for (const exe of ["usr/bin/node", "bin/kill"]) {
        writeFileSync(join(root, exe), "#!/bin/sh\n");
        chmodSync(join(root, exe), 0o755);
      }
      const units = ["llmgw-server.service", "llmgw-agent.service"];
      for (const u of units)
        cpSync(join(REPO, "infra", "systemd", u), join(root, "etc", "systemd", "system", u));
      const out = await run(analyze!, [
        "verify",
        `--root=${root}`,
        ...units.map((u) => `/etc/systemd/system/${u}`),
      ]).catch((e: { code: number; stdout: string; stderr: string }) => e);
      expect(`${out.stdout}${out.stderr}`).toBe("");

      // The user both run as, from the shipped sysusers.d file.
      await run("systemd-sysusers", [
        `--root=${root}`,
        join(REPO, "infra", "systemd", "llmgw.sysusers.conf"),
      ]);
      expect(readFileSync(join(root, "etc", "passwd"), "utf8")).toMatch(
        /^llmgw:x:\d+:\d+:llmgw:\/var\/lib\/llmgw:/m,
      );
    },
  );

  const why = whyNoManager();
  describe.skipIf(why)(`under a systemd manager${why ? ` (skipped: ${why})` : ""}`, () => {
    let mgr: UnitManager;
    let adminUrl: string;
    const node = "systemd-node";

    beforeAll(async () => {
      mgr = await startPrivateManager(join(dir, "systemd"), `llmgw-test-${TAG}`);
      const agentPort = await freePort();
      const adminPort = await freePort();
      adminUrl = `http://127.0.0.1:${adminPort}`;
      // The shipped units, with a drop-in each that changes only what this
      // machine forces, nothing about how they are stopped or restarted:
      // no llmgw user (the manager runs as root); this install's paths; the
      // working directory a system manager defaults to (a user manager
      // defaults to ~, which ProtectHome= hides); logs to files (no journal).
      // PrivateTmp= hides this test's /tmp from the server, so the install
      // (and the node that runs it: a checkout may live under /tmp too)
      // is bound into its namespace and its configuration lives in its
      // state directory.
      const common = (name: string) => `[Service]
User=
Group=
WorkingDirectory=/
EnvironmentFile=
StandardOutput=append:${join(dir, `${name}.log`)}
StandardError=append:${join(dir, `${name}.log`)}
ExecStart=
`;
      const dropIns: Record<string, string> = {
        "llmgw-server.service": `${common("server")}BindReadOnlyPaths=${installed.app} ${dirname(realpathSync(process.execPath))}
ExecStart=${process.execPath} ${installed.bin} server --config %S/llmgw/llmgw.yaml\n`,
        "llmgw-agent.service": `${common("agent")}Environment="LLMGW_AGENT_ARGS=--control-plane http://127.0.0.1:${agentPort} --node ${node} --simulate-gpus 8xH100-80GB --advertise-address ${loopbackAddress(node)}"
ExecStart=${process.execPath} ${installed.bin} agent --state-dir %S/llmgw-agent $LLMGW_AGENT_ARGS
`,
      };
      for (const [unit, dropIn] of Object.entries(dropIns)) {
        cpSync(join(REPO, "infra", "systemd", unit), join(mgr.unitDir, unit));
        mkdirSync(join(mgr.unitDir, `${unit}.d`));
        writeFileSync(join(mgr.unitDir, `${unit}.d`, "test.conf"), dropIn);
      }
      mkdirSync(join(mgr.stateRoot, "llmgw"), { recursive: true });
      writeFileSync(
        join(mgr.stateRoot, "llmgw", "llmgw.yaml"),
        `agent_listen: 127.0.0.1:${agentPort}\nadmin_listen: 127.0.0.1:${adminPort}\ndata_dir: ${join(mgr.stateRoot, "llmgw")}\n${modelsConfig(await freePortBlock(50))}`,
      );
      await mgr.systemctl("daemon-reload");
      await mgr.systemctl("start", "llmgw-server.service");
      await waitUntil("the control plane under systemd", () => controlClient(adminUrl).listNodes({}), 30_000);
      await mgr.systemctl("start", "llmgw-agent.service");
    }, 120_000);

    afterAll(async () => {
      await mgr?.systemctl("stop", "llmgw-agent.service", "llmgw-server.service").catch(() => undefined);
      await mgr?.close();
      killProcessesMatching(SOURCE);
    });

    it("restarting the agent unit leaves its engine running, and the new agent adopts it", async () => {
      expect(await mgr.property("llmgw-agent.service", "KillMode")).toBe("process");
      const before = await readyReplica(adminUrl);
      const pid = before.shards[0]!.pid;
      const client = controlClient(adminUrl);
      const agentBefore = (await client.getNode({ name: node })).node!.agentInstance;
      const mainBefore = await mgr.property("llmgw-agent.service", "MainPID");
      // The engine is a process of the agent's unit, in its cgroup.
      expect(readFileSync(`/proc/${pid}/cgroup`, "utf8")).toContain("/llmgw-agent.service");

      await mgr.systemctl("restart", "llmgw-agent.service");

      expect(await mgr.property("llmgw-agent.service", "MainPID")).not.toBe(mainBefore);
      expect(processRunning(pid)).toBe(true);
      await waitUntil("the restarted agent registered", async () => {
        const n = (await client.getNode({ name: node })).node;
        return n?.connected && n.agentInstance !== agentBefore;
      });
      const after = await readyReplica(adminUrl);
      expect(after.shards[0]!.pid).toBe(pid);
      expect(after.restarts).toBe(0);
    }, 90_000);

    it("under systemd's default KillMode=control-group, the same restart kills the engine", async () => {
      const { shards } = await readyReplica(adminUrl);
      const pid = shards[0]!.pid;
      writeFileSync(
        join(mgr.unitDir, "llmgw-agent.service.d", "zz-default-killmode.conf"),
        "[Service]\nKillMode=control-group\n",
      );
      await mgr.systemctl("daemon-reload");
      expect(await mgr.property("llmgw-agent.service", "KillMode")).toBe("control-group");

      await mgr.systemctl("restart", "llmgw-agent.service");

      await waitUntil("the engine gone", () => !processRunning(pid), 10_000);
    }, 90_000);
  });
});
