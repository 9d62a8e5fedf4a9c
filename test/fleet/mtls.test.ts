import { copyFileSync, existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { connect as h2connect } from "node:http2";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildRegister } from "../../agent/wire.ts";
import { createCsr } from "../../common/x509.ts";
import { loadOrCreateCa, signClientCsr } from "../../controlplane/pki/ca.ts";
import { AgentMessageSchema } from "../../proto/gen/agent/v1/agent_pb.ts";
import { type ControlPlaneHandle, startAgent, startControlPlane, tempDir } from "../harness/fleet.ts";
import { type Proc, waitUntil } from "../harness/process.ts";
import { rawAgentStream } from "../harness/raw-agent-stream.ts";

const CONFIG = `
agent_tls:
  enabled: true
  hostnames: [localhost, 127.0.0.1]
control:
  heartbeat_interval: 300ms
`;

function register(name: string) {
  return buildRegister({
    nodeName: name,
    agentVersion: "raw",
    agentInstance: `${name}-raw`,
    advertiseAddress: "127.0.0.1",
    fabric: {},
    shards: [],
    inventory: { cpuCores: 1, ramTotalMiB: 1, hostname: name, simulated: true, gpus: [] },
  });
}

/** A Connect stream over TLS with the given client credentials; what comes back until it ends. */
function tlsStream(url: string, tls: { ca: string; cert?: string; key?: string }, node: string) {
  const msg = create(AgentMessageSchema, { msg: { case: "register", value: register(node) } });
  return rawAgentStream(url, [msg], { tls, timeoutMs: 5_000 });
}

describe("mTLS between agents and the control plane", () => {
  let cp: ControlPlaneHandle;
  let tlsCp: ControlPlaneHandle;
  let https: string;
  let caPem: string;
  const procs: Proc[] = [];
  const agent = (node: string, o: Parameters<typeof startAgent>[2] = {}) => {
    const p = startAgent(tlsCp, node, o);
    procs.push(p);
    return p;
  };
  const token = async (...args: string[]) => {
    const r = await cp.ctl("tokens", "create", ...args);
    expect(r.code, r.stderr).toBe(0);
    return r.stdout.trim();
  };
  const metrics = async () => (await fetch(`${cp.adminUrl}/metrics`)).text();
  /** Until the control plane has NAME registered, ready and connected (by an agent other than `instance`). */
  const registered = (name: string, instance?: string) =>
    waitUntil(`${name} registered`, async () =>
      (await cp.nodes()).find(
        (n) => n.name === name && n.state === "ready" && n.connected && n.agentInstance !== instance,
      ),
    );

  beforeAll(async () => {
    cp = await startControlPlane(CONFIG);
    https = cp.agentUrl.replace(/^http:/, "https:");
    // The harness's agents dial cp.agentUrl: the same control plane, over https.
    tlsCp = { ...cp, agentUrl: https };
    caPem = readFileSync(join(cp.dir, "data", "pki", "ca.crt"), "utf8");
  });
  afterAll(async () => {
    for (const p of procs) await p.kill();
    await cp?.proc.kill();
  });

  it("creates the CA and a server certificate, and says the listener is mTLS", async () => {
    const pki = join(cp.dir, "data", "pki");
    expect(statSync(join(pki, "ca.key")).mode & 0o777).toBe(0o600);
    expect(statSync(join(pki, "server.key")).mode & 0o777).toBe(0o600);
    expect(cp.proc.output()).toContain("agent listener is mTLS");
    expect(cp.proc.output()).not.toContain("agent listener is plaintext h2c");
  });

  it("enrolls an agent with a join token; it registers and is ready", async () => {
    const t = await token("--ttl", "10m", "--uses", "1");
    expect(t).toMatch(/^[0-9a-f]{64}\.[0-9a-f]{64}$/);
    const a = agent("tls-a", { extra: ["--join-token", t] });
    const first = await registered("tls-a");
    const state = join(cp.dir, "agents", "tls-a");
    expect(statSync(join(state, "agent.key")).mode & 0o777).toBe(0o600);
    expect(existsSync(join(state, "agent.crt")) && existsSync(join(state, "ca.crt"))).toBe(true);
    const nodes = await cp.ctl("nodes");
    expect(nodes.stdout).toMatch(/tls-a\s+ready/);
    expect(await metrics()).toMatch(/llmgw_agent_enrollments_total\{result="enrolled"\} 1/);

    // Restarted without the token: it reconnects with the stored certificate.
    await a.kill();
    const again = agent("tls-a");
    await registered("tls-a", first.agentInstance);
    expect(again.output()).toContain("using the stored client certificate");
    expect(again.output()).not.toContain("enrolling with the control plane");
  });

  it("refuses an agent that claims another node with this node's certificate", async () => {
    const stolen = tempDir("stolen");
    mkdirSync(stolen, { recursive: true });
    for (const f of ["agent.key", "agent.crt", "ca.crt"])
      copyFileSync(join(cp.dir, "agents", "tls-a", f), join(stolen, f));
    const b = agent("tls-b", { stateDir: stolen });
    await b.waitFor(/control plane refused this agent.*wrong_identity/);
    expect(b.output()).toContain('the client certificate is for node \\"tls-a\\"');
    await b.kill();
    expect((await cp.nodes()).some((n) => n.name === "tls-b")).toBe(false);
    expect(await metrics()).toMatch(/llmgw_agent_rejections_total\{reason="wrong_identity"\} [1-9]/);
    expect(cp.proc.output()).toMatch(/agent refused: certificate is for another node/);
  });

  it("tells an agent with neither certificate nor token what to do, and exits", async () => {
    const p = agent("tls-c");
    expect(await p.exited).toBe(1);
    expect(p.output()).toMatch(
      /no client certificate in .* and no --join-token: create one with `llmgw ctl tokens create`/,
    );
  });

  it("refuses a used-up, an expired, an unknown and a wrong-CA token with a clear message", async () => {
    const once = await token();
    agent("tls-d", { extra: ["--join-token", once] });
    await registered("tls-d");
    const reuse = agent("tls-e", { extra: ["--join-token", once] });
    expect(await reuse.exited).toBe(1);
    expect(reuse.output()).toContain(
      "enrollment refused by the control plane: the join token has already been used up",
    );

    const short = JSON.parse(await token("--ttl", "1s", "--json")) as { token: string; expiresAt: string };
    await waitUntil("the short token expired", () => Date.now() > Date.parse(short.expiresAt), 5_000, 20);
    const late = agent("tls-f", { extra: ["--join-token", short.token] });
    expect(await late.exited).toBe(1);
    expect(late.output()).toMatch(/enrollment refused by the control plane: the join token expired at/);

    const fp = once.split(".")[1]!;
    const unknown = agent("tls-g", { extra: ["--join-token", `${"x".repeat(43)}.${fp}`] });
    expect(await unknown.exited).toBe(1);
    expect(unknown.output()).toContain("the join token is not known to this control plane");

    const fresh = await token();
    const wrongFp = `${fresh.split(".")[0]}.${"0".repeat(64)}`;
    const mitm = agent("tls-h", { extra: ["--join-token", wrongFp] });
    expect(await mitm.exited).toBe(1);
    expect(mitm.output()).toMatch(/CA fingerprint mismatch: the control plane at 127\.0\.0\.1:\d+ presents/);
    // The mismatch is found before Enroll: the token is still good.
    agent("tls-h", { extra: ["--join-token", fresh], stateDir: tempDir("tls-h2") });
    await registered("tls-h");
    expect(await metrics()).toMatch(/llmgw_agent_enrollments_total\{result="token_used_up"\} 1/);
  });

  it("accepts --ca-file instead of pinning from the handshake, and checks it against the token", async () => {
    const dir = tempDir("cafile");
    const caFile = join(dir, "ca.crt");
    copyFileSync(join(cp.dir, "data", "pki", "ca.crt"), caFile);
    const t = await token();
    agent("tls-i", { extra: ["--join-token", t, "--ca-file", caFile] });
    await registered("tls-i");

    const other = await loadOrCreateCa(tempDir("other-ca"));
    const otherFile = join(dir, "other.crt");
    writeFileSync(otherFile, other.ca.certPem);
    const b = agent("tls-j", { extra: ["--join-token", await token(), "--ca-file", otherFile] });
    expect(await b.exited).toBe(1);
    expect(b.output()).toMatch(/CA fingerprint mismatch: .*other\.crt has sha256/);
  });

  it("does not let a client without an authorized certificate open the Connect stream", async () => {
    // h2c against the TLS listener: no HTTP/2 session at all.
    const h2c = await new Promise<string>((resolve) => {
      const s = h2connect(cp.agentUrl);
      s.on("error", (e) => resolve(`error: ${e.message}`));
      s.on("close", () => resolve("closed"));
      const req = s.request({ ":method": "POST", ":path": "/agent.v1.AgentService/Connect" });
      req.on("error", (e) => resolve(`error: ${e.message}`));
      req.on("response", (h) => resolve(`status ${h[":status"]}`));
      req.end();
      setTimeout(() => resolve("timeout"), 5_000);
    });
    expect(h2c).toMatch(/^(error|closed)/);

    // TLS, trusting the CA, without a client certificate.
    const anon = await tlsStream(https, { ca: caPem }, "anon");
    expect(anon.received[0]?.msg).toMatchObject({ case: "reject", value: { code: "unauthenticated" } });

    // A certificate from another CA for a real node name is no better.
    const other = await loadOrCreateCa(tempDir("rogue-ca"));
    const { keyPem, csrPem } = await createCsr("tls-a");
    const cert = await signClientCsr(other.ca, csrPem, "tls-a", 86_400_000);
    const rogue = await tlsStream(https, { ca: caPem, cert, key: keyPem }, "tls-a");
    expect(rogue.received[0]?.msg).toMatchObject({ case: "reject", value: { code: "unauthenticated" } });

    expect(await metrics()).toMatch(/llmgw_agent_rejections_total\{reason="unauthenticated"\} [2-9]/);
    // tls-a's own agent is untouched.
    expect((await cp.nodes()).find((n) => n.name === "tls-a")).toMatchObject({
      state: "ready",
      connected: true,
    });
  });

  it("says what to do when the control plane's certificate does not verify", async () => {
    // An agent enrolled with a CA the control plane no longer has (CA replaced).
    const stale = tempDir("stale-ca");
    const old = await loadOrCreateCa(tempDir("old-ca"));
    const { keyPem, csrPem } = await createCsr("tls-k");
    writeFileSync(join(stale, "agent.key"), keyPem, { mode: 0o600 });
    writeFileSync(join(stale, "agent.crt"), await signClientCsr(old.ca, csrPem, "tls-k", 86_400_000));
    writeFileSync(join(stale, "ca.crt"), old.ca.certPem);
    const k = agent("tls-k", { stateDir: stale });
    await k.waitFor(/control plane stream failed.*does not chain to the CA this agent trusts/);
    await k.kill();

    // A name the listener's certificate does not carry: a clear, final error.
    const named = await startControlPlane("agent_tls:\n  enabled: true\n  hostnames: [localhost]\n");
    try {
      const t = (await named.ctl("tokens", "create")).stdout.trim();
      const p = startAgent({ ...named, agentUrl: named.agentUrl.replace(/^http:/, "https:") }, "tls-l", {
        extra: ["--join-token", t],
      });
      procs.push(p);
      expect(await p.exited).toBe(1);
      expect(p.output()).toContain(
        "the control plane's certificate does not name 127.0.0.1: add it to agent_tls.hostnames",
      );
    } finally {
      await named.proc.kill();
    }
  });

  it("keeps its CA across a control plane restart: enrolled agents reconnect, nothing is re-issued", async () => {
    const before = cp.proc.output();
    const fp = /"ca_fingerprint":"([0-9a-f]{64})"/.exec(before)?.[1];
    expect(fp).toBeDefined();
    await cp.proc.kill();
    await cp.restart();
    const after = cp.proc.output();
    expect(after).toContain(`"ca_fingerprint":"${fp}"`);
    expect(after).not.toContain("created the agent CA");
    expect(after).not.toContain("issued the agent listener certificate");
    const want = ["tls-a", "tls-d", "tls-h", "tls-i"];
    const back = async () => {
      const nodes = await cp.nodes();
      return want.every((n) => nodes.some((x) => x.name === n && x.connected && x.state === "ready"));
    };
    try {
      await waitUntil("enrolled agents reconnected", back, 45_000);
    } catch (err) {
      const nodes = (await cp.nodes()).map((n) => `${n.name}:${n.state}:${n.connected}`).join(" ");
      const logs = procs
        .filter((p) => p.child.exitCode === null)
        .map((p) => `--- ${p.name}\n${p.output().slice(-1500)}`)
        .join("\n");
      throw new Error(`${(err as Error).message}; nodes: ${nodes}\n${logs}`);
    }
  });

  it("refuses ctl tokens create on a plaintext control plane", async () => {
    const plain = await startControlPlane("");
    try {
      const r = await plain.ctl("tokens", "create");
      expect(r.code).toBe(1);
      expect(r.stderr).toContain("agent mTLS is not enabled on this control plane");
      expect(plain.proc.output()).toContain("agent listener is plaintext h2c");
    } finally {
      await plain.proc.kill();
    }
  });
});
