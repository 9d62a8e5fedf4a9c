import { readFileSync } from "node:fs";
import { connect as h2connect } from "node:http2";
import { connect as tcpConnect } from "node:net";
import { join } from "node:path";
import { connect as tlsConnect } from "node:tls";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ControlPlaneHandle, startAgent, startControlPlane } from "../harness/fleet.ts";
import { type Proc, waitUntil } from "../harness/process.ts";

/**
 * Both listeners hold a bounded number of connections, in total and per
 * source address, and close the ones that do nothing (config `listeners`,
 * docs/security.md). The floods come from other loopback addresses than
 * the agent's, as they would from other hosts.
 */
const CONFIG = `
agent_tls:
  enabled: true
  hostnames: [127.0.0.1]
control:
  heartbeat_interval: 300ms
listeners:
  max_connections: 250
  max_connections_per_address: 100
  auth_timeout: 8s
  idle_timeout: 3s
`;

interface Opened {
  /** Resolves true once the session is up, false when it was refused. */
  up: Promise<boolean>;
  closed: Promise<void>;
}

/** A TLS + HTTP/2 session without a client certificate that sends the preface and then nothing. */
function idleH2(url: string, ca: string, from: string): Opened {
  const { hostname, port } = new URL(url);
  const s = h2connect(url, {
    createConnection: () =>
      tlsConnect({
        socket: tcpConnect({ host: hostname, port: Number(port), localAddress: from }),
        host: hostname,
        ca,
        ALPNProtocols: ["h2"],
      }),
  });
  const up = new Promise<boolean>((resolve) => {
    s.once("connect", () => resolve(true));
    s.once("error", () => resolve(false));
    s.once("close", () => resolve(false));
  });
  const closed = new Promise<void>((resolve) => s.once("close", () => resolve()));
  s.on("error", () => {});
  return { up, closed };
}

/**
 * A TCP connection that sends nothing; resolves `closed` when the server
 * ends it. A refused one is accepted by the kernel and then destroyed by the
 * server, so "connected" says nothing of admission: the test counts closes.
 */
function idleTcp(port: number, from: string): Promise<void> {
  const s = tcpConnect({ host: "127.0.0.1", port, localAddress: from });
  s.on("error", () => {});
  return new Promise<void>((resolve) => s.once("close", () => resolve()));
}

async function flood(open: () => Opened, n: number) {
  const all = Array.from({ length: n }, open);
  const up = await Promise.all(all.map((o) => o.up));
  return { all, admitted: up.filter(Boolean).length };
}

/** Every connection closed by the server within the deadline. */
async function allClosed(conns: Opened[], what: string) {
  let closed = 0;
  for (const c of conns) void c.closed.then(() => closed++);
  await waitUntil(what, () => closed === conns.length, 20_000);
}

describe("bounded listeners (real control plane and agent)", () => {
  let cp: ControlPlaneHandle;
  let https: string;
  let ca: string;
  const procs: Proc[] = [];

  beforeAll(async () => {
    cp = await startControlPlane(CONFIG);
    https = cp.agentUrl.replace(/^http:/, "https:");
    ca = readFileSync(join(cp.dir, "data", "pki", "ca.crt"), "utf8");
  });
  afterAll(async () => {
    for (const p of procs) await p.kill();
    await cp?.proc.kill();
  });

  it("agent listener: caps idle sessions per address and in total, closes them, and a real agent still enrols", async () => {
    const a = await flood(() => idleH2(https, ca, "127.0.0.5"), 150);
    const b = await flood(() => idleH2(https, ca, "127.0.0.6"), 150);
    const c = await flood(() => idleH2(https, ca, "127.0.0.7"), 100);
    expect([a.admitted, b.admitted, c.admitted]).toEqual([100, 100, 50]);
    const refused = (cap: string) =>
      cp.metric(`llmgw_listener_connections_refused_total{listener="agent",cap="${cap}"}`);
    expect(await refused("per_address")).toBe(100);
    expect(await refused("total")).toBe(50);

    // Sessions without a certificate that open no stream are closed.
    await allClosed([...a.all, ...b.all, ...c.all], "every idle session closed");
    expect(
      await cp.metric('llmgw_listener_idle_closed_total{listener="agent",reason="unauthenticated"}'),
    ).toBe(250);
    await waitUntil(
      "no connection left",
      async () => (await cp.metric('llmgw_listener_connections{listener="agent"}')) === 0,
    );

    const token = (await cp.ctl("tokens", "create")).stdout.trim();
    const agent = startAgent({ ...cp, agentUrl: https }, "cap-a", {
      gpus: "1xH100-80GB",
      extra: ["--join-token", token],
    });
    procs.push(agent);
    const registered = await waitUntil("cap-a ready", async () => {
      const n = (await cp.nodes()).find((x) => x.name === "cap-a");
      return n?.connected && n.state === "ready" ? n.registeredAt : undefined;
    });
    // The agent's stream outlives idle_timeout (3 s) untouched: it is never idle.
    await waitUntil("idle_timeout passed", () => Date.now() > Date.parse(registered) + 4_000);
    const n = (await cp.nodes()).find((x) => x.name === "cap-a");
    expect(n).toMatchObject({ connected: true, state: "ready", registeredAt: registered });
    expect(await cp.metric("llmgw_agent_registrations_total")).toBe(1);
  });

  it("admin listener: caps idle connections per address, closes them, and still answers", async () => {
    const port = Number(new URL(cp.adminUrl).port);
    const idle = Array.from({ length: 150 }, () => idleTcp(port, "127.0.0.8"));
    let closed = 0;
    for (const c of idle) void c.then(() => closed++);
    const refused = () =>
      cp.metric('llmgw_listener_connections_refused_total{listener="admin",cap="per_address"}');
    await waitUntil("the refusals counted", async () => (await refused()) >= 50);
    await waitUntil("the refused connections closed", () => closed >= 50);
    expect(await refused()).toBe(50);
    expect(150 - closed, "connections held").toBe(100);
    const nodes = await cp.ctl("nodes");
    expect(nodes.code, nodes.stderr).toBe(0);
    expect(nodes.stdout).toMatch(/cap-a\s+ready/);
    // Request headers are due within auth_timeout (8 s).
    await waitUntil("every idle admin connection closed", () => closed === idle.length, 20_000);
    expect((await fetch(`${cp.adminUrl}/healthz`)).status).toBe(200);
  });
});
