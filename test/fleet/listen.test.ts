import { writeFileSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { tempDir } from "../harness/fleet.ts";
import { freePort, startLlmgw } from "../harness/process.ts";

/**
 * A control plane that cannot bind one of its listeners exits non-zero and
 * says which, instead of running half up (docs/operating.md).
 */
describe("llmgw server with a listener's port taken (real process)", () => {
  const squatters: Server[] = [];
  afterAll(() => {
    for (const s of squatters) s.close();
  });

  async function squat(): Promise<number> {
    const server = createServer();
    squatters.push(server);
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    return (server.address() as { port: number }).port;
  }

  for (const taken of ["admin_listen", "agent_listen"] as const) {
    it(`exits 1 naming ${taken} when its port is in use`, async () => {
      const dir = tempDir("listen");
      const port = await squat();
      const ports = {
        agent_listen: taken === "agent_listen" ? port : await freePort(),
        admin_listen: taken === "admin_listen" ? port : await freePort(),
      };
      const config = join(dir, "llmgw.yaml");
      writeFileSync(
        config,
        `agent_listen: 127.0.0.1:${ports.agent_listen}\nadmin_listen: 127.0.0.1:${ports.admin_listen}\ndata_dir: ${join(dir, "data")}\n`,
      );
      const proc = startLlmgw("control-plane", ["server", "--config", config], { LLMGW_ADMIN_TOKEN: "" });
      const code = await Promise.race([
        proc.exited,
        new Promise<string>((r) => setTimeout(() => r("still running after 20 s"), 20_000)),
      ]);
      if (code === "still running after 20 s") await proc.kill();
      expect(code).toBe(1);
      expect(proc.output()).toContain(
        `llmgw server: ${taken} 127.0.0.1:${port}: the port is already in use (another llmgw server, or another program?) (EADDRINUSE)`,
      );
    }, 30_000);
  }
});
