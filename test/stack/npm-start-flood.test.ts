import { rmSync } from "node:fs";
import { request } from "node:http";
import { afterAll, describe, expect, it } from "vitest";
import { runCurl, type StackRun, stackPorts, startStack } from "../../scripts/stack-run.ts";
import { tempDir } from "../harness/fleet.ts";
import { waitUntil } from "../harness/process.ts";

/**
 * Issue 24's last door: one client opening 300 streams at once with the
 * README's key on `npm start`'s stack. Under `wrangler dev` this ran
 * workerd out of file descriptors through wrangler's local proxy and the
 * edge stopped answering until restarted; the stack now serves the edge on
 * workerd's own socket, and the key's `max_concurrent` (32, README) turns
 * the excess away at once. Every request must end as a finished stream or a
 * clean refusal — none hangs, none is reset — `/healthz` must answer while
 * they run and after, and the key must serve again once they are over.
 */
const STREAMS = 300;
/** Long enough (~3 s at the local llama's speed) that the admitted streams still run when the last request arrives. */
const MAX_TOKENS = 300;
/** A request not over by then hangs. */
const REQUEST_DEADLINE_MS = 120_000;
/** Refusals that say when to come back: the key's cap, its rate windows, its band's queue. */
const CLEAN_REFUSALS = new Set(["concurrency_limit", "rate_limit_exceeded", "queue_full", "queue_timeout"]);

interface Outcome {
  status: number;
  code: string | null;
  retryAfter: string | undefined;
  /** A 200 stream that reached `data: [DONE]`. */
  done: boolean;
  /** A socket error or a response cut off before its end. */
  error: string | undefined;
}

/** One streamed chat on a connection of its own (no pooling), read to its end. */
function stream(url: string, key: string): Promise<Outcome> {
  const body = JSON.stringify({
    model: "llama-8b",
    messages: [{ role: "user", content: "Hello" }],
    stream: true,
    max_tokens: MAX_TOKENS,
  });
  return new Promise((resolve) => {
    const req = request(`${url}/v1/chat/completions`, {
      method: "POST",
      agent: false,
      headers: {
        authorization: `Bearer ${key}`,
        "content-type": "application/json",
        "content-length": Buffer.byteLength(body),
      },
      timeout: REQUEST_DEADLINE_MS,
    });
    const fail = (error: string, status = 0) =>
      resolve({ status, code: null, retryAfter: undefined, done: false, error });
    req.on("timeout", () => {
      req.destroy();
      fail(`no answer within ${REQUEST_DEADLINE_MS} ms`);
    });
    req.on("error", (err: NodeJS.ErrnoException) => fail(err.code ?? err.message));
    req.on("response", (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => {
        text += c;
      });
      res.on("error", (err: NodeJS.ErrnoException) => fail(err.code ?? err.message, res.statusCode));
      res.on("end", () => {
        const status = res.statusCode ?? 0;
        if (!res.complete) return fail("response cut off", status);
        let code: string | null = null;
        if (status !== 200) {
          try {
            code = (JSON.parse(text) as { error?: { code?: string } }).error?.code ?? null;
          } catch {
            return fail(`not an OpenAI error: ${text.slice(0, 200)}`, status);
          }
        }
        const retryAfter = res.headers["retry-after"];
        resolve({ status, code, retryAfter, done: /^data: \[DONE\]$/m.test(text), error: undefined });
      });
    });
    req.end(body);
  });
}

async function healthz(url: string): Promise<boolean> {
  const res = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(10_000) });
  return res.ok && ((await res.json()) as { status?: string }).status === "ok";
}

describe("npm start's stack under 300 concurrent streams from one key", () => {
  const stateDir = tempDir("npm-start-flood");
  let run: StackRun | undefined;

  afterAll(() => {
    run?.destroy();
    rmSync(stateDir, { recursive: true, force: true });
  });

  it("finishes or cleanly refuses every stream, keeps /healthz up, and serves the key again afterwards", async () => {
    const ports = await stackPorts();
    run = startStack(stateDir, ports);
    const banner = await run.banner;
    const edge = `http://127.0.0.1:${ports.edge}`;

    let pending = STREAMS;
    const outcomes = Promise.all(
      Array.from({ length: STREAMS }, () =>
        stream(edge, banner.key).finally(() => {
          pending--;
        }),
      ),
    );
    // /healthz while the streams run: each probe must answer; at least one
    // must have been made while some were still open.
    const probes: { ok: boolean; pending: number }[] = [];
    await waitUntil(
      "every stream ended, /healthz probed throughout",
      async () => {
        const at = pending;
        if (at === 0) return true;
        probes.push({ ok: await healthz(edge).catch(() => false), pending: at });
        return false;
      },
      REQUEST_DEADLINE_MS + 30_000,
      200,
    );
    const all = await outcomes;

    const broken = all.filter((o) => o.error !== undefined);
    expect(broken.map((o) => `${o.status} ${o.error}`)).toEqual([]);
    const served = all.filter((o) => o.status === 200);
    const refused = all.filter((o) => o.status !== 200);
    expect(served.filter((o) => !o.done)).toEqual([]);
    for (const o of refused) {
      expect([429, 503], JSON.stringify(o)).toContain(o.status);
      expect(CLEAN_REFUSALS.has(o.code ?? ""), JSON.stringify(o)).toBe(true);
      expect(Number(o.retryAfter), JSON.stringify(o)).toBeGreaterThan(0);
    }
    // The key's cap, not luck, shaped the run: some streams ran, the cap turned many away.
    expect(served.length).toBeGreaterThan(0);
    expect(refused.filter((o) => o.code === "concurrency_limit").length).toBeGreaterThan(0);
    const byCode: Record<string, number> = {};
    for (const o of all) byCode[o.code ?? String(o.status)] = (byCode[o.code ?? String(o.status)] ?? 0) + 1;
    console.log(`300 streams from one key: ${JSON.stringify(byCode)}; ${probes.length} /healthz probes`);

    expect(probes.filter((p) => p.pending > 0 && p.ok).length).toBeGreaterThan(0);
    expect(probes.filter((p) => !p.ok)).toEqual([]);
    await waitUntil("/healthz after the streams", () => healthz(edge), 30_000, 250);

    // The slots are given back: the README's curl streams to its end again.
    await waitUntil(
      "the README's curl served after the streams",
      async () => {
        const curl = await runCurl(banner.curl);
        return curl.status === 200 && curl.done;
      },
      30_000,
      1_000,
    );
  }, 400_000);
});
