import { execFile } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { parse } from "yaml";
import { z } from "zod";
import { REPO, runLlmgw } from "../harness/process.ts";
import { documentedMetrics } from "../harness/prometheus.ts";
import { readPromql } from "../harness/promql.ts";

// Every example in infra/ is checked: the configurations by llmgw itself,
// the editor schema against the code, and the tunnel material against the
// examples it serves. (The systemd units: install.test.ts.)
const run = promisify(execFile);
const INFRA = join(REPO, "infra");

function filesUnder(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? filesUnder(join(dir, e.name)) : [join(dir, e.name)],
  );
}

const configs = filesUnder(INFRA).filter((f) => /\/llmgw[^/]*\.ya?ml$/.test(f));

describe("infra/ examples", () => {
  it("include the configurations this test checks", () => {
    expect(configs.map((f) => relative(REPO, f))).toEqual(
      expect.arrayContaining(["infra/examples/llmgw.yaml", "infra/local/llmgw.yaml"]),
    );
  });

  it.each(configs.map((f) => [relative(REPO, f)]))("llmgw config check %s passes", async (file) => {
    const r = await runLlmgw(["config", "check", file]);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
  });

  it("llmgw ctl endpoints check passes on the router-only example", async () => {
    const r = await runLlmgw(["ctl", "endpoints", "check", "infra/examples/endpoints.yaml"]);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
  });

  it("the editor schema is what `llmgw config schema` prints now", async () => {
    const r = await runLlmgw(["config", "schema"]);
    expect(r.code).toBe(0);
    // When this fails: npx llmgw config schema > infra/examples/llmgw.schema.json
    expect(r.stdout).toBe(readFileSync(join(INFRA, "examples", "llmgw.schema.json"), "utf8"));
  });
});

interface Endpoint {
  id: string;
  url: string;
  via?: "direct" | "vpc" | "tunnel";
}

/** The sets and the port range of egress.nft, as written. */
function egressRules(text: string) {
  const set = (name: string) => {
    const m = new RegExp(`set ${name} \\{[^}]*elements = \\{([^}]*)\\}`, "s").exec(text);
    if (!m) throw new Error(`egress.nft: no set ${name}`);
    return m[1]!
      .split(",")
      .map((s) => s.trim())
      .filter(Boolean);
  };
  const range = /ip daddr @gpu_nodes tcp dport (\d+)-(\d+) accept/.exec(text);
  if (!range) throw new Error("egress.nft: no port range for @gpu_nodes");
  return {
    gpuNodes: set("gpu_nodes"),
    staticEngines: set("static_engines").map((e) => e.replace(/\s+\.\s+/, ":")),
    portRange: [Number(range[1]), Number(range[2])],
  };
}

function inCidr(ip: string, cidr: string): boolean {
  const [net, bits = "32"] = cidr.split("/");
  const n = (a: string) => a.split(".").reduce((acc, o) => acc * 256 + Number(o), 0);
  const size = 2 ** (32 - Number(bits));
  return Math.floor(n(ip) / size) === Math.floor(n(net!) / size);
}

describe("infra/cloudflared", () => {
  const tunnel = parse(readFileSync(join(INFRA, "cloudflared", "config.yml"), "utf8")) as {
    tunnel: string;
    "credentials-file": string;
    protocol: string;
    ingress: { hostname?: string; service: string }[];
  };
  const nftText = readFileSync(join(INFRA, "cloudflared", "egress.nft"), "utf8");
  const egress = egressRules(nftText);
  const endpoints = parse(readFileSync(join(INFRA, "examples", "endpoints.yaml"), "utf8")) as Endpoint[];
  const example = parse(readFileSync(join(INFRA, "examples", "llmgw.yaml"), "utf8")) as {
    control: { port_range: number[] };
  };
  const allowed = (hostPort: string) => {
    const [ip, port] = hostPort.split(":");
    const placed =
      egress.gpuNodes.some((c) => inCidr(ip!, c)) &&
      Number(port) >= egress.portRange[0]! &&
      Number(port) <= egress.portRange[1]!;
    return placed || egress.staticEngines.includes(hostPort);
  };

  it("is a tunnel on QUIC whose ingress ends in a catch-all", () => {
    expect(tunnel["credentials-file"]).toContain(tunnel.tunnel);
    expect(tunnel.protocol).toBe("quic");
    expect(tunnel.ingress.at(-1)).toEqual({ service: "http_status:404" });
    expect(tunnel.ingress.slice(0, -1).every((r) => r.hostname)).toBe(true);
  });

  it("serves every via: tunnel endpoint of the router-only example, and its egress allows the engine", () => {
    const viaTunnel = endpoints.filter((e) => e.via === "tunnel");
    expect(viaTunnel.length).toBeGreaterThan(0);
    for (const e of viaTunnel) {
      const rule = tunnel.ingress.find((r) => r.hostname === new URL(e.url).hostname);
      expect(rule, e.id).toBeDefined();
      expect(allowed(new URL(rule!.service).host), `${e.id} → ${rule!.service}`).toBe(true);
    }
  });

  it("lets the host reach every via: vpc endpoint, and engines on the example's port range", () => {
    const viaVpc = endpoints.filter((e) => e.via === "vpc");
    expect(viaVpc.length).toBeGreaterThan(0);
    for (const e of viaVpc) expect(allowed(new URL(e.url).host), e.id).toBe(true);
    expect(egress.portRange).toEqual(example.control.port_range);
  });

  const nft = ["/usr/sbin/nft", "/sbin/nft"].find((p) => existsSync(p));
  const noNft = !nft
    ? 'nft is not installed (README.md, "Test it")'
    : process.getuid?.() !== 0
      ? "nft -c talks to the kernel's nf_tables and needs root"
      : undefined;
  it.skipIf(noNft)(`egress.nft passes nft -c${noNft ? ` (skipped: ${noNft})` : ""}`, async () => {
    const r = await run(nft!, ["-c", "-f", join(INFRA, "cloudflared", "egress.nft")]).catch(
      (e: { stdout: string; stderr: string }) => e,
    );
    expect(`${r.stdout}${r.stderr}`).toBe("");
  });
});

describe("infra/grafana/llmgw.json", () => {
  const panel = z.object({
    title: z.string(),
    type: z.string(),
    targets: z.array(z.object({ expr: z.string().min(1) })).optional(),
  });
  const dashboard = z.object({ title: z.string(), uid: z.string(), panels: z.array(panel).min(1) });
  const documented = new Set(
    ["Control plane", "Agent"].flatMap((s) => documentedMetrics(s).map((m) => m.name)),
  );

  it("queries only metrics docs/metrics.md lists, and every llmgw_ metric listed is on it", () => {
    const d = dashboard.parse(JSON.parse(readFileSync(join(INFRA, "grafana", "llmgw.json"), "utf8")));
    // As Grafana sends them: its range variable filled in ($cp_job and the like sit inside strings).
    const queries = d.panels
      .flatMap((p) => p.targets ?? [])
      .map((t) => readPromql(t.expr.replaceAll("$__rate_interval", "5m")));
    expect(queries.flatMap((q) => q.errors)).toEqual([]);
    const used = new Set(queries.flatMap((q) => q.selectors.map((s) => s.metric)));
    expect(used.size).toBeGreaterThan(10);
    for (const name of used) expect(documented, `${name} is not in docs/metrics.md`).toContain(name);
    for (const name of documented)
      if (name.startsWith("llmgw_")) expect(used, `${name} is on no panel`).toContain(name);
  });
});
