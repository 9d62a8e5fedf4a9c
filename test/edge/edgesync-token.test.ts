import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, describe, expect, it } from "vitest";
import { newSecret } from "../../cli/ctl/keys.ts";
import { edgeSyncClient } from "../../common/edgesync-client.ts";
import { EdgeSyncService } from "../../proto/gen/edge/v1/edgesync_pb.ts";
import { type ControlPlaneHandle, startControlPlane, tempDir } from "../harness/fleet.ts";
import { freePort, waitUntil } from "../harness/process.ts";
import {
  clientFor,
  createKey,
  type Edge,
  type EdgeOptions,
  startEdge,
  startEdgeMiniflare,
  startSim,
  stopStarted,
} from "./helpers.ts";

/**
 * The EdgeSync secret: an edge without EDGE_SYNC_TOKEN is never open, and
 * the token rotates with a second one, EDGE_SYNC_TOKEN_NEXT, accepted
 * beside it. The rotation runs as docs/edge.md writes it down, with real
 * processes: the edge restarted on its own port and state directory as a
 * new Worker version would be, a control plane publishing throughout.
 */
const methods = EdgeSyncService.methods.map((m) => m.name);

/** Every EdgeSync method with an empty request: the statuses and Connect codes the edge answered. */
async function callEach(url: string, token: string | undefined) {
  return Promise.all(
    methods.map(async (m) => {
      const res = await fetch(`${url}/${EdgeSyncService.typeName}/${m}`, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          ...(token ? { authorization: `Bearer ${token}` } : {}),
        },
        body: "{}",
      });
      const body = (await res.json()) as { code?: string; message?: string };
      return `${m} ${res.status} ${body.code}`;
    }),
  );
}

const refusedWith = (status: number, code: string) => methods.map((m) => `${m} ${status} ${code}`);

describe("an edge without EDGE_SYNC_TOKEN", () => {
  afterAll(stopStarted);

  it("refuses every EdgeSync call, whatever is presented, EDGE_SYNC_TOKEN_NEXT alone included", async () => {
    const next = newSecret();
    const [unset, empty] = await Promise.all([
      startEdgeMiniflare({}, { EDGE_SYNC_TOKEN: undefined, EDGE_SYNC_TOKEN_NEXT: next }),
      startEdgeMiniflare({}, { EDGE_SYNC_TOKEN: "" }),
    ]);
    for (const edge of [unset, empty]) {
      for (const presented of [next, "", "anything"]) {
        expect(await callEach(edge.url, presented)).toEqual(refusedWith(503, "unavailable"));
      }
    }
    const res = await fetch(`${unset.url}/${EdgeSyncService.typeName}/ListKeys`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${next}` },
      body: "{}",
    });
    expect(await res.json()).toEqual({
      code: "unavailable",
      message: "EdgeSync is disabled: EDGE_SYNC_TOKEN is not set",
    });
  });

  it("with a token, answers 401 to a missing or wrong one and serves the right one", async () => {
    const edge = await startEdgeMiniflare();
    expect(await callEach(edge.url, undefined)).toEqual(refusedWith(401, "unauthenticated"));
    expect(await callEach(edge.url, `${edge.token}x`)).toEqual(refusedWith(401, "unauthenticated"));
    expect(await callEach(edge.url, edge.token.slice(0, -1))).toEqual(refusedWith(401, "unauthenticated"));
    expect((await edge.sync.listKeys({})).keys).toEqual([]);
  });
});

describe("rotating the EdgeSync token", () => {
  const state = tempDir("edge-rotation");
  const cpDir = tempDir("cp-rotation");
  let edge: Edge | undefined;
  let cp: ControlPlaneHandle | undefined;

  afterAll(async () => {
    await cp?.proc.kill();
    await stopStarted();
    rmSync(state, { recursive: true, force: true });
    rmSync(cpDir, { recursive: true, force: true });
  });

  it("NEXT at the edge, switch the control plane, promote, remove: the control plane publishes at every step and nothing is lost", async () => {
    const [oldToken, newToken] = [newSecret(), newSecret()];
    const [port, agentPort, adminPort] = await Promise.all([freePort(), freePort(), freePort()]);
    const sim = await startSim("rot");
    // A new Worker version: same URL, same KV and Durable Objects, other secrets.
    const deploy = async (opts: EdgeOptions) => {
      await edge?.stop();
      edge = await startEdge({}, "edge", { port, persistTo: state, ...opts });
      return edge;
    };
    const accepts = async (url: string, token: string) => {
      try {
        await edgeSyncClient(url, token).listKeys({});
        return true;
      } catch (err) {
        if (err instanceof ConnectError && err.code === Code.Unauthenticated) return false;
        throw err;
      }
    };
    const config = (n: number) =>
      [
        "edge:",
        `  url: http://127.0.0.1:${port}`,
        "  token_env: LLMGW_TEST_EDGE_TOKEN",
        // No agents here: the hold a restart puts on the endpoint set (until
        // agents report) is not what this test is about.
        "control: { startup_grace: 1s, lost_after: 2s }",
        "models: [{ name: rot }]",
        n === 0 ? "endpoints: []" : "endpoints:",
        ...Array.from({ length: n }, (_, i) => `  - { id: e${i + 1}, url: "${sim.url}", models: [rot] }`),
      ].join("\n");
    const startCp = (n: number, token: string) =>
      startControlPlane(config(n), {
        dir: cpDir,
        env: { LLMGW_TEST_EDGE_TOKEN: token },
        agentPort,
        adminPort,
      });
    // SIGHUP with one more static endpoint: what the control plane publishes next.
    const reload = (n: number) => {
      const text = readFileSync(cp!.configPath, "utf8");
      writeFileSync(cp!.configPath, text.slice(0, text.indexOf("edge:")) + config(n));
      cp!.proc.child.kill("SIGHUP");
    };
    const published = (n: number, token: string) =>
      waitUntil(`the control plane's set of ${n} endpoints at the edge`, async () => {
        const { pools } = await edgeSyncClient(edge!.url, token).getPoolStatus({ model: "rot" });
        const ids = pools[0]?.endpoints.map((e) => e.id).sort();
        return JSON.stringify(ids) === JSON.stringify(Array.from({ length: n }, (_, i) => `e${i + 1}`));
      });
    // A request through the edge, and its charge stored by the key's ledger: `wrangler dev` stopped
    // at once would drop a charge still in waitUntil, which a deployed Worker's old version finishes.
    let served = 0;
    const chat = async (token: string) => {
      const r = await clientFor(edge!, key.secret).chat.completions.create({
        model: "rot",
        messages: [{ role: "user", content: "hi" }],
        max_tokens: 2,
      });
      served++;
      await waitUntil(`${served} requests charged to the key`, async () => {
        const { usage } = await edgeSyncClient(edge!.url, token).getUsage({ keyId: key.id });
        return Number(usage[0]!.requests) === served;
      });
      return r.usage?.completion_tokens;
    };

    await deploy({ token: oldToken });
    const key = await createKey(edge!);
    cp = await startCp(1, oldToken);
    await published(1, oldToken);
    expect(await chat(oldToken)).toBe(2);

    // 1. The edge takes the new token as NEXT; the control plane still presents the old one.
    await deploy({ token: oldToken, vars: { EDGE_SYNC_TOKEN_NEXT: newToken } });
    expect([await accepts(edge!.url, oldToken), await accepts(edge!.url, newToken)]).toEqual([true, true]);
    reload(2);
    await published(2, oldToken);
    expect(await chat(oldToken)).toBe(2);

    // 2. The control plane switches: restarted with the new token in its environment.
    await cp.proc.kill();
    cp = await startCp(3, newToken);
    await published(3, newToken);

    // 3. Promote the new token and remove NEXT: the old one is refused from now on.
    await deploy({ token: newToken });
    expect([await accepts(edge!.url, oldToken), await accepts(edge!.url, newToken)]).toEqual([false, true]);
    reload(4);
    await published(4, newToken);
    // The key made before the rotation, and its usage (counted by chat), came through it.
    expect(await chat(newToken)).toBe(2);

    // And an empty set the control plane means (its config lists no endpoint any more) is
    // taken: the publisher says allow_empty, without which the edge refuses to be emptied.
    reload(0);
    await published(0, newToken);
  }, 240_000);
});
