import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import {
  crashesCounted,
  runCurl,
  type StackRun,
  stackPorts,
  stackProcesses,
  startStack,
} from "../../scripts/stack-run.ts";
import { launchChromium, screenshot } from "../harness/browser.ts";
import { tempDir } from "../harness/fleet.ts";
import { REPO } from "../harness/process.ts";

/**
 * The README's first five minutes: `npm start` on a fresh state directory,
 * the README's curl the moment the banner prints, Ctrl-C as a terminal
 * sends it (SIGINT to the whole process group), and `npm start` again.
 * Two starts here; `npm run check:start` runs ten fresh starts and three
 * cycles and prints the timings.
 */
/**
 * The banner's dashboard link, clicked: it carries the token `npm start`
 * keeps in the state directory, and the page signs in with it and lists the
 * stack's two nodes.
 */
async function opensSignedIn(link: string, stateDir: string): Promise<void> {
  const token = readFileSync(join(stateDir, "admin.token"), "utf8").trim();
  expect(new URL(link).hash).toBe(`#token=${token}`);
  const browser = await launchChromium();
  try {
    const page = await browser.newPage();
    await page.goto(link);
    for (const node of ["gpu-node-1", "gpu-node-2"])
      await page.locator(`#fleet tr[data-node="${node}"][data-state="ready"]`).waitFor({ timeout: 15_000 });
    await screenshot(page, "npm-start", "dashboard");
  } finally {
    await browser.close();
  }
}

describe("npm start, as a new user runs it", () => {
  const stateDir = tempDir("npm-start");
  let run: StackRun | undefined;

  afterAll(() => {
    run?.destroy();
    rmSync(stateDir, { recursive: true, force: true });
  });

  it("serves the README's curl at the banner, stops whole on Ctrl-C, and starts again without counting a crash", async () => {
    const ports = await stackPorts();
    const keys: string[] = [];
    const edgeTokens: string[] = [];
    for (const cycle of [1, 2]) {
      run = startStack(stateDir, ports);
      const banner = await run.banner;
      keys.push(banner.key);
      edgeTokens.push(readFileSync(join(stateDir, "edge.token"), "utf8"));
      const curl = await runCurl(banner.curl);
      expect(curl.status, `cycle ${cycle}: ${curl.output}`).toBe(200);
      expect(curl.content.length).toBeGreaterThan(0);
      expect(curl.done).toBe(true);
      // The banner's curl is the README's, with the key and port filled in.
      const body = /-d '[^']+'/.exec(banner.curl)![0];
      expect(readFileSync(join(REPO, "README.md"), "utf8")).toContain(body);
      if (cycle === 1) await opensSignedIn(banner.dashboard, stateDir);

      expect(await crashesCounted(run), `cycle ${cycle}`).toEqual([]);

      const stopped = await run.interrupt();
      expect(stopped.code).toBe(0);
      expect(stackProcesses(run.mark), run.output().slice(-3000)).toEqual([]);
    }
    // One state directory, one API key and one EdgeSync secret, like its admin token.
    expect(keys[1]).toBe(keys[0]);
    expect(edgeTokens[1]).toBe(edgeTokens[0]);
  }, 400_000);
});
