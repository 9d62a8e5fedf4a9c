import { chmodSync, mkdirSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { startAgent, startControlPlane, tempDir } from "../harness/fleet.ts";
import { type Proc, waitUntil } from "../harness/process.ts";

/**
 * What the control plane and the agent keep on disk is readable by their
 * owner only (docs/security.md): created so, and tightened at start when an
 * older release, a umask or a copy left it looser.
 */
const mode = (p: string) => statSync(p).mode & 0o777;

describe("files at rest are owner-only (real processes)", () => {
  const procs: Proc[] = [];
  afterAll(async () => {
    for (const p of procs) await p.kill();
  });

  it("tightens data_dir, pki/, the database and the agent's state dir found world-readable", async () => {
    const dir = tempDir("at-rest");
    const data = join(dir, "data");
    mkdirSync(join(data, "pki"), { recursive: true });
    writeFileSync(join(data, "llmgw.db"), "");
    chmodSync(data, 0o755);
    chmodSync(join(data, "pki"), 0o755);
    chmodSync(join(data, "llmgw.db"), 0o644);
    const cp = await startControlPlane("agent_tls:\n  enabled: true\n  hostnames: [127.0.0.1]\n", { dir });
    procs.push(cp.proc);
    expect(mode(data)).toBe(0o700);
    expect(mode(join(data, "pki"))).toBe(0o700);
    for (const f of readdirSync(data).filter((f) => f.startsWith("llmgw.db")))
      expect(mode(join(data, f)), f).toBe(0o600);
    expect(mode(join(data, "pki", "ca.key"))).toBe(0o600);

    const state = join(dir, "agents", "files-a");
    mkdirSync(state, { recursive: true });
    chmodSync(state, 0o755);
    const token = (await cp.ctl("tokens", "create")).stdout.trim();
    const agent = startAgent({ ...cp, agentUrl: cp.agentUrl.replace(/^http:/, "https:") }, "files-a", {
      gpus: "1xH100-80GB",
      stateDir: state,
      extra: ["--join-token", token],
    });
    procs.push(agent);
    await waitUntil("files-a registered", async () => (await cp.nodes()).some((n) => n.name === "files-a"));
    expect(mode(state)).toBe(0o700);
    expect(mode(join(state, "agent.key"))).toBe(0o600);
  });
});
