/**
 * A sim engine as these tests start it, and the wait until it serves: one
 * copy for every file here.
 */
import { join } from "node:path";
import { freePort, type Proc, REPO, startLlmgw, startProcess, waitUntil } from "../harness/process.ts";

export interface SimProcess {
  proc: Proc;
  port: number;
  url: string;
}

/**
 * The sim engine's vLLM persona for `model` on a free loopback port: run as
 * `llmgw sim-engine serve`, or through test/bin/vllm as the agent runs vLLM.
 */
export async function startVllmSim(
  name: string,
  model: string,
  flags: string[],
  o: { env?: NodeJS.ProcessEnv; viaShim?: boolean } = {},
): Promise<SimProcess> {
  const port = await freePort();
  const args = ["serve", model, "--host", "127.0.0.1", "--port", String(port), ...flags];
  const proc = o.viaShim
    ? startProcess(name, join(REPO, "test", "bin", "vllm"), args, o.env)
    : startLlmgw(name, ["sim-engine", ...args], o.env);
  return { proc, port, url: `http://127.0.0.1:${port}` };
}

/** Until the engine's /health answers 200. */
export async function healthy(e: { proc: Proc; url: string }): Promise<void> {
  await waitUntil(
    `${e.proc.name} healthy`,
    async () => (await fetch(`${e.url}/health`)).status === 200,
    20_000,
    50,
  );
}
