import { randomBytes } from "node:crypto";
import { writeFileSync } from "node:fs";
import { request as httpRequest } from "node:http";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { Code, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { killEngines } from "../../agent/kill-engines.ts";
import { ControlService } from "../../proto/gen/control/v1/control_pb.ts";
import { type ControlPlaneHandle, startAgent, startControlPlane, tempDir } from "../harness/fleet.ts";
import { freePort, type Proc, runLlmgw, startLlmgw, waitForHttp, waitUntil } from "../harness/process.ts";
import { parseExposition, sampleValue } from "../harness/prometheus.ts";

const token = () => randomBytes(32).toString("hex");

/** A ControlService client that sends `authorization` exactly as given (or none). */
function rawClient(url: string, authorization?: string) {
  const auth: Interceptor = (next) => (req) => {
    if (authorization !== undefined) req.header.set("authorization", authorization);
    return next(req);
  };
  return createClient(
    ControlService,
    createConnectTransport({ baseUrl: url, httpVersion: "1.1", interceptors: [auth] }),
  );
}

type AnyCall = (req: object) => Promise<unknown>;

/** A request per method that would change something (or read something) if it were let through. */
function requestFor(method: string, node: string): object {
  switch (method) {
    case "getNode":
      return { name: node };
    case "cordon":
    case "uncordon":
    case "revokeNode":
      return { node };
    case "drain":
      return { node, deadlineMs: 1_000 };
    case "explain":
      return { model: "tiny" };
    case "createJoinToken":
      return { ttlMs: 600_000n, uses: 5 };
    default:
      return {};
  }
}

async function code(p: Promise<unknown>): Promise<Code | "ok"> {
  try {
    await p;
    return "ok";
  } catch (err) {
    return err instanceof ConnectError ? err.code : Code.Unknown;
  }
}

const CONFIG = `
agent_tls:
  enabled: true
  hostnames: [127.0.0.1]
control:
  interval: 1s
  startup_grace: 1s
  heartbeat_interval: 300ms
models:
  - name: tiny
    profiles:
      - name: 1gpu
        engine: vllm
        source: sim/auth-tiny
        engine_args: ["--max-model-len", "4096", "--sim-speed", "50"]
        replicas: { min: 1 }
        startup_deadline: 60s
        stop_grace: 5s
`;

describe("the admin API needs the admin token (real processes)", () => {
  const adminToken = token();
  let cp: ControlPlaneHandle;
  let agent: Proc;

  beforeAll(async () => {
    cp = await startControlPlane(CONFIG, { adminToken });
    const join = (await cp.ctl("tokens", "create")).stdout.trim();
    agent = startAgent({ ...cp, agentUrl: cp.agentUrl.replace(/^http:/, "https:") }, "auth-a", {
      gpus: "1xH100-80GB",
      extra: ["--join-token", join, "--vllm-bin", "test/bin/vllm"],
    });
    await waitUntil(
      "tiny ready on auth-a",
      async () => (await cp.client.listReplicas({})).replicas.some((r) => r.state === "ready"),
      90_000,
    );
  }, 120_000);

  afterAll(async () => {
    await agent?.kill();
    await cp?.proc.kill();
    if (cp) killEngines(join(cp.dir, "agents"));
  });

  /** Operator intent, tokens and certificates in SQLite; nodes and replicas as ControlService shows them. */
  async function snapshot() {
    const db = new DatabaseSync(join(cp.dir, "data", "llmgw.db"), { readOnly: true });
    const rows = (sql: string) => JSON.stringify(db.prepare(sql).all());
    const stored = {
      intents: rows("SELECT * FROM node_intent ORDER BY node"),
      tokens: rows("SELECT hash, uses_left, expires_at FROM join_tokens ORDER BY hash"),
      certs: rows("SELECT serial, node, revoked_at FROM agent_certificates ORDER BY serial"),
    };
    db.close();
    const { replicas } = await cp.client.listReplicas({});
    const { nodes } = await cp.client.listNodes({});
    return {
      stored,
      replicas: replicas.map((r) => ({
        id: r.id,
        state: r.state,
        restarts: r.restarts,
        shards: r.shards.map((s) => `${s.nodeName}#${s.rank}:${s.state}:${s.pid}`),
      })),
      nodes: nodes.map((n) => ({
        name: n.name,
        state: n.state,
        connected: n.connected,
        cordoned: n.cordoned,
        draining: n.draining,
        revoked: n.revokedAtUnixMs,
      })),
    };
  }

  it("refuses every call without the token, or with a wrong one, with Unauthenticated, and changes nothing", async () => {
    const before = await snapshot();
    expect(before.replicas).toHaveLength(1);
    expect(before.nodes).toEqual([
      expect.objectContaining({ name: "auth-a", state: 1, connected: true, cordoned: false }),
    ]);
    const credentials: (string | undefined)[] = [
      undefined,
      "",
      `Bearer ${token()}`,
      `Bearer ${adminToken.slice(0, -1)}`,
      `Bearer ${adminToken}x`,
      `Bearer ${adminToken.toUpperCase()}`,
      `Basic ${Buffer.from(`admin:${adminToken}`).toString("base64")}`,
      adminToken,
    ];
    const methods = ControlService.methods.map((m) => m.localName);
    expect(methods).toEqual(
      expect.arrayContaining(["cordon", "drain", "createJoinToken", "revokeNode", "listNodes"]),
    );
    for (const auth of credentials) {
      const client = rawClient(cp.adminUrl, auth) as unknown as Record<string, AnyCall>;
      for (const m of methods) {
        expect(await code(client[m]!(requestFor(m, "auth-a"))), `${m} with ${auth ?? "no header"}`).toBe(
          Code.Unauthenticated,
        );
      }
    }
    // Two reconcile passes later — time to act on anything that had got
    // through (a drain would move the replica, a revoke drop the node) —
    // nothing has changed.
    const passes = async () => Number(/llmgw_reconcile_passes_total (\d+)/.exec(await cp.metrics())?.[1]);
    const after = (await passes()) + 2;
    await waitUntil("two reconcile passes", async () => (await passes()) >= after);
    expect(await snapshot()).toEqual(before);
    expect(await cp.metrics()).toMatch(/llmgw_admin_auth_failures_total\{reason="wrong"\} [1-9]/);
    expect(cp.proc.output()).toMatch(/"msg":"admin call refused"/);

    // The same calls with the token do act: the refusals above were about the token only.
    const ok = rawClient(cp.adminUrl, `Bearer ${adminToken}`);
    await ok.cordon({ node: "auth-a" });
    expect((await cp.nodes())[0]!.cordoned).toBe(true);
    await ok.uncordon({ node: "auth-a" });
  });

  it("ctl reads the token from $LLMGW_ADMIN_TOKEN or --token-file, and says what is missing", async () => {
    const bare = await runLlmgw(["ctl", "cordon", "auth-a", "--control-plane", cp.adminUrl], {
      LLMGW_ADMIN_TOKEN: "",
    });
    expect(bare.code).toBe(3);
    expect(bare.stderr).toContain(
      "this control plane requires an admin token: set $LLMGW_ADMIN_TOKEN or pass --token-file",
    );
    const wrong = await runLlmgw(["ctl", "nodes", "--control-plane", cp.adminUrl], {
      LLMGW_ADMIN_TOKEN: token(),
    });
    expect(wrong.code).toBe(3);
    expect(wrong.stderr).toContain("the admin token is not valid for this control plane");

    const file = join(tempDir("ctl-token"), "admin.token");
    writeFileSync(file, `${adminToken}\n`, { mode: 0o600 });
    const viaFile = await runLlmgw(["ctl", "nodes", "--control-plane", cp.adminUrl, "--token-file", file], {
      LLMGW_ADMIN_TOKEN: "",
    });
    expect(viaFile.code, viaFile.stderr).toBe(0);
    expect(viaFile.stdout).toMatch(/auth-a\s+ready/);
    expect((await cp.ctl("nodes")).stdout).toMatch(/auth-a\s+ready/);
  });

  it("guards /metrics like a read-only call, and leaves /healthz open", async () => {
    expect((await fetch(`${cp.adminUrl}/metrics`)).status).toBe(401);
    expect(
      (await fetch(`${cp.adminUrl}/metrics`, { headers: { authorization: `Bearer ${token()}` } })).status,
    ).toBe(401);
    expect(await cp.metrics()).toMatch(/llmgw_agent_streams 1/);
    expect((await fetch(`${cp.adminUrl}/healthz`)).status).toBe(200);
  });
});

describe("admin token configuration (real processes)", () => {
  const procs: Proc[] = [];
  afterAll(async () => {
    for (const p of procs) await p.kill();
  });

  it("opens exactly the calls docs/security.md lists to read_only_networks, each checked", async () => {
    const cp = await startControlPlane("admin:\n  read_only_networks: [127.0.0.0/8]\n", {
      adminToken: token(),
    });
    procs.push(cp.proc);
    // What docs/security.md promises: these, and nothing else, without a token.
    const open = new Set(["listNodes", "getNode", "listReplicas", "listModels", "explain"]);
    const anon = rawClient(cp.adminUrl) as unknown as Record<string, AnyCall>;
    const methods = Object.keys(ControlService.method);
    expect(methods).toEqual(expect.arrayContaining([...open, "getKeyUsage", "getEdgeStatus"]));
    for (const m of methods) {
      const got = await code(anon[m]!(requestFor(m, "x")));
      if (open.has(m)) expect(got, m).not.toBe(Code.Unauthenticated);
      else expect(got, m).toBe(Code.Unauthenticated);
    }
    expect((await fetch(`${cp.adminUrl}/metrics`)).status).toBe(200);
  });

  it("answers only requests addressed to its own names or addresses (DNS rebinding)", async () => {
    const cp = await startControlPlane("admin:\n  allowed_hosts: [cp.example]\n");
    procs.push(cp.proc);
    const { port } = new URL(cp.adminUrl);
    const get = (path: string, host: string) =>
      new Promise<{ status: number; body: string }>((resolve, reject) => {
        const req = httpRequest(
          {
            host: "127.0.0.1",
            port: Number(port),
            path,
            method: path.startsWith("/control") ? "POST" : "GET",
            headers: { host, "content-type": "application/json" },
          },
          (res) => {
            let body = "";
            res.on("data", (c) => (body += c));
            res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
          },
        );
        req.on("error", reject);
        req.end(path.startsWith("/control") ? "{}" : undefined);
      });
    const list = "/control.v1.ControlService/ListNodes";
    // A page at evil.example whose name now resolves to 127.0.0.1: the browser sends its own name.
    for (const path of [list, "/", "/metrics"]) {
      const r = await get(path, `evil.example:${port}`);
      expect(r.status, path).toBe(403);
      expect(r.body).toContain('Host "evil.example" is not a name of this control plane');
    }
    for (const host of [
      `127.0.0.1:${port}`,
      `localhost:${port}`,
      `cp.example:${port}`,
      `CP.example.:${port}`,
    ])
      expect((await get(list, host)).status, host).toBe(200);
    expect((await get("/healthz", "evil.example")).status).toBe(200);
  });

  it("refuses to start on a reachable admin_listen without a token, unless --insecure-admin", async () => {
    const dir = tempDir("insecure");
    const config = join(dir, "llmgw.yaml");
    const adminPort = await freePort();
    writeFileSync(
      config,
      `admin_listen: 0.0.0.0:${adminPort}\nagent_listen: 127.0.0.1:${await freePort()}\ndata_dir: ${join(dir, "data")}\n`,
    );
    const refused = await runLlmgw(["server", "--config", config], { LLMGW_ADMIN_TOKEN: "" });
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(
      /admin_listen 0\.0\.0\.0:\d+ is reachable from other hosts, and no admin token is configured/,
    );
    expect(refused.stderr).toContain("--insecure-admin");

    const short = await runLlmgw(["server", "--config", config], { LLMGW_ADMIN_TOKEN: "secret" });
    expect(short.code).toBe(1);
    expect(short.stderr).toContain("shorter than 16 characters");

    const insecure = startLlmgw("insecure", ["server", "--config", config, "--insecure-admin"], {
      LLMGW_ADMIN_TOKEN: "",
    });
    procs.push(insecure);
    await waitForHttp(insecure, `http://127.0.0.1:${adminPort}/healthz`);
    expect(insecure.output()).toMatch(
      /"level":"error","msg":"INSECURE: --insecure-admin: the admin API has no token/,
    );
  });

  it("rotates a token_file token on SIGHUP: both during the rotation, then only the new one", async () => {
    const dir = tempDir("rotate");
    const file = join(dir, "admin.token");
    const [oldToken, newToken] = [token(), token()];
    writeFileSync(file, `${oldToken}\n`, { mode: 0o600 });
    const cp = await startControlPlane(`admin:\n  token_file: ${file}\n`, { dir });
    procs.push(cp.proc);
    const works = async (t: string) =>
      (await code(rawClient(cp.adminUrl, `Bearer ${t}`).listNodes({}))) === "ok";
    expect([await works(oldToken), await works(newToken)]).toEqual([true, false]);

    writeFileSync(file, `${oldToken}\n${newToken}\n`);
    cp.proc.child.kill("SIGHUP");
    await waitUntil("the new token accepted", () => works(newToken));
    expect(await works(oldToken)).toBe(true);

    writeFileSync(file, `${newToken}\n`);
    cp.proc.child.kill("SIGHUP");
    await waitUntil("the old token refused", async () => !(await works(oldToken)));
    expect(await works(newToken)).toBe(true);

    // A file left empty is refused: the control plane keeps the token it has.
    const reloads = async (result: string) => {
      const text = await (
        await fetch(`${cp.adminUrl}/metrics`, { headers: { authorization: `Bearer ${newToken}` } })
      ).text();
      return sampleValue(parseExposition(text), "llmgw_admin_token_reloads_total", { result });
    };
    expect([await reloads("loaded"), await reloads("refused")]).toEqual([2, 0]);
    writeFileSync(file, "");
    cp.proc.child.kill("SIGHUP");
    await waitUntil("the reload refused", async () => (await reloads("refused")) === 1);
    expect(cp.proc.output()).toContain("admin token reload refused");
    expect(await works(newToken)).toBe(true);
  });
});
