import { createServer, type Server } from "node:net";
import { afterAll, describe, expect, it } from "vitest";
import { stackPorts, stackProcesses, startStack } from "../../scripts/stack-run.ts";
import { tempDir } from "../harness/fleet.ts";

/**
 * `npm start` with one of its ports taken names it and exits before
 * starting anything, instead of waiting out its deadline with one process
 * dead among the logs of the others.
 */
describe("npm start with a port taken (real process)", () => {
  let squatter: Server | undefined;
  afterAll(() => squatter?.close());

  it("names the port and its flag, exits 1, and leaves nothing running", async () => {
    const ports = await stackPorts();
    squatter = createServer();
    await new Promise<void>((resolve) => squatter!.listen(ports.admin, "127.0.0.1", resolve));
    const run = startStack(tempDir("npm-start-ports"), ports);
    const code = await Promise.race([
      run.exited,
      new Promise<string>((r) => setTimeout(() => r("still running after 60 s"), 60_000)),
    ]);
    if (typeof code === "string") run.destroy();
    expect(code, run.output()).toBe(1);
    expect(run.output()).toContain(
      `npm start: port ${ports.admin} (the control plane's admin API) on 127.0.0.1 is already in use: stop what holds it (ss -ltnp 'sport = :${ports.admin}' shows it) or choose another with --admin-port N`,
    );
    expect(stackProcesses(run.mark)).toEqual([]);
  }, 90_000);
});
