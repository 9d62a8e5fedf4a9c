import { randomBytes, X509Certificate } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { killEngines } from "../../agent/kill-engines.ts";
import { buildRegister } from "../../agent/wire.ts";
import { createCsr } from "../../common/x509.ts";
import { CertificateStore, certFacts } from "../../controlplane/certificates.ts";
import { loadOrCreateCa, signClientCsr } from "../../controlplane/pki/ca.ts";
import { AgentMessageSchema, AgentService } from "../../proto/gen/agent/v1/agent_pb.ts";
import { type ControlPlaneHandle, startAgent, startControlPlane } from "../harness/fleet.ts";
import { type Proc, waitUntil } from "../harness/process.ts";
import { rawAgentStream } from "../harness/raw-agent-stream.ts";

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
        source: sim/revoke-tiny
        engine_args: ["--max-model-len", "4096", "--sim-speed", "50"]
        replicas: { min: 1 }
        startup_deadline: 60s
        stop_grace: 2s
`;

function registerMsg(node: string) {
  return create(AgentMessageSchema, {
    msg: {
      case: "register",
      value: buildRegister({
        nodeName: node,
        agentVersion: "raw",
        agentInstance: `${node}-raw`,
        advertiseAddress: "127.0.0.1",
        fabric: {},
        shards: [],
        inventory: { cpuCores: 1, ramTotalMiB: 1, hostname: node, simulated: true, gpus: [] },
      }),
    },
  });
}

const serial = (pem: string) => new X509Certificate(pem).serialNumber.toLowerCase().replace(/^0+/, "");

describe("revocation and renewal of agent certificates (real processes)", () => {
  let cp: ControlPlaneHandle;
  let https: string;
  const agents = new Map<string, Proc>();
  const stateDir = (node: string) => join(cp.dir, "agents", node);
  const agent = (node: string, extra: string[] = []) => {
    const p = startAgent({ ...cp, agentUrl: https }, node, {
      gpus: "1xH100-80GB",
      extra: ["--vllm-bin", "test/bin/vllm", "--stable-after", "1s", ...extra],
    });
    agents.set(node, p);
    return p;
  };
  const joinToken = async () => {
    const r = await cp.ctl("tokens", "create");
    expect(r.code, r.stderr).toBe(0);
    return r.stdout.trim();
  };
  const replica = async () => (await cp.client.listReplicas({})).replicas[0];

  beforeAll(async () => {
    cp = await startControlPlane(CONFIG, { adminToken: randomBytes(24).toString("hex") });
    https = cp.agentUrl.replace(/^http:/, "https:");
    for (const node of ["rv-1", "rv-2"]) agent(node, ["--join-token", await joinToken()]);
    await waitUntil("tiny ready", async () => (await replica())?.state === "ready", 90_000);
  }, 120_000);

  afterAll(async () => {
    for (const p of agents.values()) await p.kill();
    await cp?.proc.kill();
    if (cp) killEngines(join(cp.dir, "agents"));
  });

  it("revokes a node: its stream closes, it is lost at once, its replica moves, ctl shows it revoked", async () => {
    const before = (await replica())!;
    const victim = before.shards[0]!.nodeName;
    const other = victim === "rv-1" ? "rv-2" : "rv-1";
    const r = await cp.ctl("nodes", "revoke", victim);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(
      new RegExp(`^${victim}: revoked 1 certificate, stream closed; re-admitting it takes a new join token`),
    );

    // The agent is told, sets its certificate aside and stops.
    const a = agents.get(victim)!;
    const exited = await Promise.race([
      a.exited,
      new Promise((r) => setTimeout(() => r("still running"), 30_000)),
    ]);
    expect(
      exited,
      `agent ${victim}:\n${a.output().slice(-3000)}\ncontrol plane:\n${cp.proc.output().slice(-2000)}`,
    ).toBe(1);
    expect(a.output()).toMatch(/"msg":"this node's certificate was revoked: stopping/);
    expect(existsSync(join(stateDir(victim), "agent.crt.revoked"))).toBe(true);
    expect(existsSync(join(stateDir(victim), "agent.crt"))).toBe(false);

    const node = (await cp.nodes()).find((n) => n.name === victim)!;
    expect(node).toMatchObject({ state: "lost", revoked: true, connected: false });
    expect((await cp.ctl("nodes")).stdout).toMatch(new RegExp(`${victim}\\s+revoked`));
    // Lost at once (not after lost_after), so the replica is placed on the other node.
    await waitUntil(
      "the replica ready elsewhere",
      async () => {
        const now = await replica();
        return now?.state === "ready" && now.shards[0]?.nodeName === other;
      },
      100_000,
    ).catch(async (err: Error) => {
      const r = await replica();
      throw new Error(
        `${err.message}; replica: ${JSON.stringify(r?.shards.map((x) => [x.nodeName, x.state]))} ${r?.state}\n${cp.proc.output().slice(-3000)}`,
      );
    });
  }, 150_000);

  it("a revoked certificate can neither reconnect nor enroll again; a new join token re-admits the node", async () => {
    const victim = (await cp.nodes()).find((n) => n.revoked)!.name;
    const dir = stateDir(victim);
    const revoked = {
      ca: readFileSync(join(dir, "ca.crt"), "utf8"),
      cert: readFileSync(join(dir, "agent.crt.revoked"), "utf8"),
      key: readFileSync(join(dir, "agent.key"), "utf8"),
    };
    // The same agent, restarted without a token, says what to do.
    const again = agent(victim);
    expect(await again.exited).toBe(1);
    expect(again.output()).toContain("this node's certificate was revoked");

    // The revoked certificate itself, presented on the stream…
    const stream = await rawAgentStream(https, [registerMsg(victim)], { tls: revoked, timeoutMs: 5_000 });
    expect(stream.received[0]?.msg).toMatchObject({ case: "reject", value: { code: "revoked" } });
    // …and to Enroll, even with a valid join token.
    const enroll = createClient(
      AgentService,
      createConnectTransport({ baseUrl: https, httpVersion: "2", nodeOptions: revoked }),
    );
    const { csrPem } = await createCsr(victim, revoked.key);
    const err = await enroll
      .enroll({ token: await joinToken(), nodeName: victim, csrPem })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code).toBe(Code.PermissionDenied);
    expect((err as ConnectError).rawMessage).toMatch(/is revoked/);
    expect((await cp.nodes()).find((n) => n.name === victim)).toMatchObject({
      revoked: true,
      connected: false,
    });

    // Re-admission: a new join token, a new certificate.
    agent(victim, ["--join-token", await joinToken()]);
    await waitUntil("re-admitted", async () =>
      (await cp.nodes()).some((n) => n.name === victim && n.state === "ready" && !n.revoked && n.connected),
    );
    expect(serial(readFileSync(join(dir, "agent.crt"), "utf8"))).not.toBe(serial(revoked.cert));
    expect(existsSync(join(dir, "agent.crt.revoked"))).toBe(false);
  });

  it("renews a certificate before expiry over the stream, across control plane restarts", async () => {
    const node = (await replica())!.shards[0]!.nodeName === "rv-1" ? "rv-2" : "rv-1";
    const dir = stateDir(node);
    await agents.get(node)!.kill();
    await cp.proc.kill("SIGKILL");

    // A certificate from the control plane's CA with 25 s left of an hour:
    // due for renewal, and soon unusable.
    const { ca } = await loadOrCreateCa(join(cp.dir, "data", "pki"));
    const { keyPem, csrPem } = await createCsr(node);
    const shortLived = await signClientCsr(ca, csrPem, node, 3_600_000, () => Date.now() - 3_575_000);
    writeFileSync(join(dir, "agent.key"), keyPem, { mode: 0o600 });
    writeFileSync(join(dir, "agent.crt"), shortLived);
    const oldSerial = serial(shortLived);
    // Recorded as the node's certificate, as if the control plane had issued
    // it: only the serial on record may hold a node's stream (docs/agents.md).
    const record = new CertificateStore(join(cp.dir, "data", "llmgw.db"));
    record.note(certFacts(shortLived));
    record.bind(certFacts(shortLived), Date.now());
    record.close();

    // The agent starts while the control plane is down, renews once it is back.
    const a = agent(node);
    await a.waitFor("using the stored client certificate");
    await cp.restart();
    const renewed = await waitUntil(
      "the certificate renewed",
      () => {
        const pem = readFileSync(join(dir, "agent.crt"), "utf8");
        return serial(pem) !== oldSerial ? pem : undefined;
      },
      30_000,
    );
    expect(serial(renewed)).not.toBe(oldSerial);
    expect(Date.parse(new X509Certificate(renewed).validTo)).toBeGreaterThan(Date.now() + 300 * 86_400_000);
    expect(cp.proc.output()).toMatch(/"msg":"agent certificate renewed"/);
    expect(await cp.metrics()).toMatch(/llmgw_agent_enrollments_total\{result="renewed"\} 1/);

    // The old certificate lapses: the control plane ends the stream opened
    // with it, and the agent comes back with the renewed one — no token.
    await waitUntil(
      "the stream on the lapsed certificate ended",
      async () => (await cp.metric('llmgw_agent_rejections_total{reason="certificate_expired"}')) > 0,
      40_000,
    );
    await waitUntil(
      "back on the renewed certificate",
      async () => (await cp.nodes()).some((n) => n.name === node && n.connected && n.state === "ready"),
      30_000,
    );
    expect(Date.now()).toBeGreaterThan(Date.parse(new X509Certificate(shortLived).validTo));

    // And after another kill -9 and restart, it is the renewed certificate that gets it in.
    await cp.proc.kill("SIGKILL");
    await cp.restart();
    await waitUntil(
      "reconnected after the restart",
      async () => (await cp.nodes()).some((n) => n.name === node && n.connected && n.state === "ready"),
      45_000,
    );
    // The lapsed certificate gets nowhere, renewal or not.
    const lapsed = await rawAgentStream(https, [registerMsg(node)], {
      tls: { ca: readFileSync(join(dir, "ca.crt"), "utf8"), cert: shortLived, key: keyPem },
      timeoutMs: 5_000,
    });
    expect(lapsed.received[0]?.msg).toMatchObject({ case: "reject", value: { code: "unauthenticated" } });
    expect(a.child.exitCode).toBeNull();
  }, 180_000);
});

describe("Enroll rate limit (real process)", () => {
  it("holds per source address, and counts and logs the refusals", async () => {
    const cp = await startControlPlane(
      "agent_tls:\n  enabled: true\n  hostnames: [127.0.0.1]\n  enroll_per_minute: 3\n",
    );
    try {
      const https = cp.agentUrl.replace(/^http:/, "https:");
      const ca = readFileSync(join(cp.dir, "data", "pki", "ca.crt"), "utf8");
      const client = createClient(
        AgentService,
        createConnectTransport({ baseUrl: https, httpVersion: "2", nodeOptions: { ca } }),
      );
      const { csrPem } = await createCsr("flood");
      const codes: string[] = [];
      for (let i = 0; i < 6; i++) {
        const err = await client
          .enroll({ token: `${"z".repeat(43)}.${"0".repeat(64)}`, nodeName: "flood", csrPem })
          .catch((e: unknown) => e);
        codes.push(err instanceof ConnectError ? Code[err.code] : "ok");
      }
      expect(codes).toEqual([
        "PermissionDenied",
        "PermissionDenied",
        "PermissionDenied",
        "ResourceExhausted",
        "ResourceExhausted",
        "ResourceExhausted",
      ]);
      const metrics = await cp.metrics();
      expect(metrics).toMatch(/llmgw_agent_enrollments_total\{result="wrong_ca"\} 3/);
      expect(metrics).toMatch(/llmgw_agent_enrollments_total\{result="rate_limited"\} 3/);
      // Each failure is logged with its source; a flood is one line per window.
      const lines = cp.proc
        .output()
        .split("\n")
        .filter((l) => l.includes('"msg":"enrollment refused"'));
      expect(lines).toHaveLength(4);
      expect(lines[3]).toMatch(/"reason":"rate_limited".*"from":"127\.0\.0\.1","failuresFromSource":4/);
      // A good token from that address waits for the budget to refill, too.
      const token = (await cp.ctl("tokens", "create")).stdout.trim();
      const good = await client.enroll({ token, nodeName: "flood", csrPem }).catch((e: unknown) => e);
      expect(good).toBeInstanceOf(ConnectError);
      expect((good as ConnectError).rawMessage).toMatch(
        /too many Enroll calls from 127\.0\.0\.1: at most 3 a minute; retry in \d+s/,
      );
    } finally {
      await cp.proc.kill();
    }
  });
});
