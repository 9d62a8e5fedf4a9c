import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createCsr } from "../../common/x509.ts";
import { loadOrCreateCa, signClientCsr } from "../../controlplane/pki/ca.ts";
import { type ControlPlaneHandle, startAgent, startControlPlane, tempDir } from "../harness/fleet.ts";
import { type Proc, waitUntil } from "../harness/process.ts";

/**
 * A node name is enrolled once (docs/agents.md#security-mtls-and-enrollment):
 * a second join token does not buy a certificate for a name that holds one,
 * and a second certificate for the name — however it was obtained — never
 * takes the node over, whether the real agent is up or not.
 */
const CONFIG = `
agent_tls:
  enabled: true
  hostnames: [127.0.0.1]
control:
  heartbeat_interval: 300ms
`;

describe("enrollment binds a node name once (real agents)", () => {
  let cp: ControlPlaneHandle;
  let https: string;
  const procs: Proc[] = [];
  const agent = (node: string, stateDir: string, extra: string[] = []) => {
    const p = startAgent({ ...cp, agentUrl: https }, node, { gpus: "1xH100-80GB", stateDir, extra });
    procs.push(p);
    return p;
  };
  const token = async (...args: string[]) => {
    const r = await cp.ctl("tokens", "create", ...args);
    expect(r.code, r.stderr).toBe(0);
    return r.stdout.trim();
  };
  const node = async (name: string) => (await cp.nodes()).find((n) => n.name === name);
  const realDir = () => join(cp.dir, "agents", "node-a");

  beforeAll(async () => {
    cp = await startControlPlane(CONFIG);
    https = cp.agentUrl.replace(/^http:/, "https:");
  });
  afterAll(async () => {
    for (const p of procs) await p.kill();
    await cp?.proc.kill();
  });

  let real: Proc;
  let realInstance: string;

  it("refuses a second join token for a name whose agent is up, and ctl nodes says who tried", async () => {
    real = agent("node-a", realDir(), ["--join-token", await token()]);
    realInstance = (
      await waitUntil("node-a ready", async () => {
        const n = await node("node-a");
        return n?.connected && n.state === "ready" ? n : undefined;
      })
    ).agentInstance;

    const impostor = agent("node-a", tempDir("impostor-1"), ["--join-token", await token()]);
    expect(await impostor.exited).toBe(1);
    expect(impostor.output()).toContain(
      'enrollment refused by the control plane: node \\"node-a\\" already holds a certificate',
    );
    expect(await cp.metric('llmgw_agent_enrollments_total{result="name_taken"}')).toBe(1);
    expect(cp.proc.output()).toMatch(/"enrollment refused".*"node":"node-a".*"reason":"name_taken".*"from":/);
    const listed = await cp.ctl("nodes");
    expect(listed.stdout).toMatch(/refused claims on node names:\n\s+node-a: name_taken from 127\.0\.0\.1/);
    expect((await node("node-a"))?.agentInstance).toBe(realInstance);
  });

  it("refuses the impostor after the real agent stopped, with a token or with a second certificate", async () => {
    await real.kill();
    await waitUntil("node-a disconnected", async () => (await node("node-a"))?.connected === false);

    const withToken = agent("node-a", tempDir("impostor-2"), ["--join-token", await token()]);
    expect(await withToken.exited).toBe(1);
    expect(withToken.output()).toContain("already holds a certificate");

    // A second certificate for the name signed by the control plane's own
    // CA (one issued before names were bound, or minted with a stolen CA
    // key): the stream is refused, however long the node has been silent.
    const { ca } = await loadOrCreateCa(join(cp.dir, "data", "pki"));
    const forged = tempDir("impostor-3");
    mkdirSync(forged, { recursive: true });
    const { keyPem, csrPem } = await createCsr("node-a");
    writeFileSync(join(forged, "agent.key"), keyPem, { mode: 0o600 });
    writeFileSync(join(forged, "agent.crt"), await signClientCsr(ca, csrPem, "node-a", 86_400_000));
    writeFileSync(join(forged, "ca.crt"), ca.certPem);
    const second = agent("node-a", forged);
    await second.waitFor(/control plane refused this agent.*wrong_certificate/);
    await waitUntil(
      "three refusals",
      async () => (await cp.metric('llmgw_agent_rejections_total{reason="wrong_certificate"}')) >= 3,
    );
    await second.kill();
    const n = await node("node-a");
    expect(n?.connected).toBe(false);
    expect(n?.agentInstance).toBe(realInstance);
    expect(n?.lastRefusedClaim).toMatchObject({ reason: "wrong_certificate", from: "127.0.0.1" });
    expect(cp.proc.output()).toMatch(/agent refused: node is bound to another certificate/);
  });

  it("takes the real agent back", async () => {
    real = agent("node-a", realDir());
    await waitUntil("node-a back", async () => {
      const n = await node("node-a");
      return n?.connected && n.state === "ready" && n.agentInstance !== realInstance;
    });
    expect(real.output()).toContain("using the stored client certificate");
  });

  it("enrolls the name again once the operator revoked it", async () => {
    const r = await cp.ctl("nodes", "revoke", "node-a");
    expect(r.code, r.stderr).toBe(0);
    expect(await real.exited).not.toBeNull();
    const again = agent("node-a", tempDir("reinstalled"), ["--join-token", await token()]);
    await waitUntil("node-a enrolled again", async () => {
      const n = await node("node-a");
      return n?.connected && n.state === "ready" && !n.revoked;
    });
    expect(again.output()).toContain("enrolling with the control plane");
  });

  it("replaces a live node with a --replace token bound to its name, and only that name", async () => {
    const old = agent("node-b", join(cp.dir, "agents", "node-b"), ["--join-token", await token()]);
    const first = await waitUntil("node-b ready", async () => {
      const n = await node("node-b");
      return n?.connected && n.state === "ready" ? n : undefined;
    });

    const bound = await token("--node", "node-b");
    const elsewhere = agent("node-c", tempDir("node-c"), ["--join-token", bound]);
    expect(await elsewhere.exited).toBe(1);
    expect(elsewhere.output()).toContain('this join token was made for node \\"node-b\\", not \\"node-c\\"');
    // Bound but not replacing: node-b still holds its certificate.
    const plain = agent("node-b", tempDir("node-b-plain"), ["--join-token", bound]);
    expect(await plain.exited).toBe(1);
    expect(plain.output()).toContain("already holds a certificate");

    const flagOnly = await cp.ctl("tokens", "create", "--replace");
    expect(flagOnly.code).toBe(1);
    expect(flagOnly.stderr).toContain("--replace needs --node NAME");

    const replacement = agent("node-b", tempDir("node-b-new"), [
      "--join-token",
      await token("--node", "node-b", "--replace"),
    ]);
    await waitUntil("node-b served by the replacement", async () => {
      const n = await node("node-b");
      return n?.connected && n.state === "ready" && n.agentInstance !== first.agentInstance;
    });
    // The old agent's certificate was revoked and its stream closed.
    expect(await old.exited).not.toBeNull();
    expect(old.output()).toMatch(/revoked/);
    expect(replacement.output()).toContain("enrolling with the control plane");
  });
});
