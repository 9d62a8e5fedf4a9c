import { randomUUID } from "node:crypto";
import type { Server } from "node:http";
import { create } from "@bufbuild/protobuf";
import { createLogger, errorMessage, type Logger } from "../common/log.ts";
import { ownerOnlyDir } from "../common/owner-only.ts";
import pkg from "../package.json" with { type: "json" };
import { AgentMessageSchema, type ControlMessage } from "../proto/gen/agent/v1/agent_pb.ts";
import type { ClientTls } from "./enroll.ts";
import { AGENT_HELP, type AgentFlags, parseAgentFlags } from "./flags.ts";
import { type InventorySource, nvidiaSmiInventory, simulatedInventory } from "./inventory.ts";
import { agentMetrics, serveMetrics } from "./metrics.ts";
import { lockStateDir } from "./state-lock.ts";
import { StreamClient } from "./stream-client.ts";
import { Supervisor } from "./supervisor.ts";
import { buildRegister, shardStatusOf } from "./wire.ts";

type Certs = typeof import("./enroll.ts");

export async function main(argv: string[]): Promise<number> {
  const f = parseFlags(argv);
  if (typeof f === "number") return f;
  const instance = randomUUID();
  const log = createLogger({ component: "agent", node: f.node });
  // Set below; the simulated inventory reads the engines it runs on each collect.
  let supervisor: Supervisor | undefined;
  const inventory = openInventory(f, () => supervisor?.list() ?? []);
  if (!inventory) return 2;
  ownerOnlyDir(f.stateDir, log);
  let unlock: () => void;
  try {
    unlock = lockStateDir(f.stateDir);
  } catch (err) {
    process.stderr.write(`llmgw agent: ${errorMessage(err)}\n`);
    return 1;
  }
  if (f.simulateGpus) log.warn("GPUs are simulated", { spec: f.simulateGpus });

  const secure = await secureChannel(f, log);
  if (secure === "failed") {
    unlock();
    return 1;
  }
  const { tls, certs } = secure;

  let client: StreamClient | undefined;
  const ownPids = () => new Set((supervisor?.list() ?? []).map((s) => s.pid).filter((p) => p > 0));
  const sup = await openSupervisor(f, log, inventory, ownPids, () => client);
  supervisor = sup;

  // Renewal goes over the stream; a revocation ends the agent (it cannot
  // reconnect with the certificate it has, and only an operator with a new
  // join token can re-admit the node).
  let revoked: (() => void) | undefined;
  const stopped = new Promise<number>((resolve) => {
    process.on("SIGINT", () => resolve(0));
    process.on("SIGTERM", () => resolve(0));
    revoked = () => resolve(1);
  });
  const renewer = certs && tls ? certificateRenewer(certs, tls, f, log, () => client) : undefined;
  const renewTimer = renewer ? setInterval(() => void renewer.check(), 3_600_000) : undefined;
  renewTimer?.unref();

  const stream = streamClient(f, log, {
    instance,
    tls,
    inventory,
    supervisor: sup,
    ownPids,
    renewer,
    onRevoked: () => {
      if (!certs) return;
      const aside = certs.setAsideRevoked(f.stateDir);
      log.error(
        "this node's certificate was revoked: stopping; re-admit it with a new join token (llmgw ctl tokens create, then --join-token)",
        { setAside: aside },
      );
      revoked?.();
    },
  });
  client = stream;
  const metricsServer = await startMetrics(f, log, sup, () => client);
  if (metricsServer === "failed") {
    sup.close();
    unlock();
    return 1;
  }
  log.info("agent starting", { controlPlane: f.controlPlane, instance, pid: process.pid, fabric: f.fabric });
  stream.start();
  const code = await stopped;
  if (renewTimer) clearInterval(renewTimer);
  // The stream goes first, so no command can start an engine behind the stop.
  await stream.stop();
  metricsServer?.close();
  if (f.stopEnginesOnExit) {
    log.info("stopping engines before exiting (--stop-engines-on-exit)");
    await sup.shutdown("agent exiting (--stop-engines-on-exit)");
  } else {
    // Engines are left running: an agent restart must never stop inference.
    sup.close();
  }
  unlock();
  return code;
}

/** The flags, or the exit code when there is nothing to run (help, a bad flag). */
function parseFlags(argv: string[]): AgentFlags | number {
  let flags: AgentFlags | "help";
  try {
    flags = parseAgentFlags(argv);
  } catch (err) {
    process.stderr.write(`llmgw agent: ${errorMessage(err)}\n\n${AGENT_HELP}`);
    return 2;
  }
  if (flags === "help") {
    process.stdout.write(AGENT_HELP);
    return 0;
  }
  return flags;
}

/** nvidia-smi, or simulated GPUs holding what the supervisor's engines hold; undefined (said on stderr) when neither can be had. */
function openInventory(
  f: AgentFlags,
  shards: () => ReturnType<Supervisor["list"]>,
): InventorySource | undefined {
  try {
    return f.simulateGpus
      ? simulatedInventory(f.node, f.simulateGpus, f.simulateForeign, () =>
          shards().map((s) => ({
            state: s.state,
            gpuIndices: s.spec?.gpuIndices ?? [],
            gpuMemoryUtilization: s.spec?.gpuMemoryUtilization ?? 0,
          })),
        )
      : nvidiaSmiInventory(f.nvidiaSmi);
  } catch (err) {
    process.stderr.write(`llmgw agent: ${errorMessage(err)}\n`);
    return undefined;
  }
}

/**
 * mTLS: load the stored client certificate, or enroll with the join token.
 * Loaded lazily: plaintext agents never pay for the X.509 code.
 */
async function secureChannel(
  f: AgentFlags,
  log: Logger,
): Promise<{ tls: ClientTls | undefined; certs: Certs | undefined } | "failed"> {
  if (!f.controlPlane.startsWith("https://")) {
    log.warn(
      "the control plane stream is plaintext h2c: use an https:// control plane with mTLS outside development",
    );
    return { tls: undefined, certs: undefined };
  }
  const certs = await import("./enroll.ts");
  try {
    const tls = await certs.loadOrEnrollWithRetry({
      url: f.controlPlane,
      node: f.node,
      stateDir: f.stateDir,
      joinToken: f.joinToken,
      caFile: f.caFile,
      log,
    });
    return { tls, certs };
  } catch (err) {
    log.error("cannot enroll with the control plane", { error: errorMessage(err) });
    process.stderr.write(`llmgw agent: ${errorMessage(err)}\n`);
    return "failed";
  }
}

/**
 * Engines run detached and outlive this process; the supervisor re-adopts
 * whatever a previous agent left running before the first Register, so
 * the control plane sees them as running, not missing. Statuses emitted
 * while adopting (before the stream client exists) are dropped: the
 * Register carries the full list.
 */
function openSupervisor(
  f: AgentFlags,
  log: Logger,
  inventory: InventorySource,
  ownPids: () => Set<number>,
  client: () => StreamClient | undefined,
): Promise<Supervisor> {
  return Supervisor.open({
    stateDir: f.stateDir,
    node: { advertiseAddress: f.advertiseAddress },
    bins: { vllm: f.vllmBin, sglang: f.sglangBin },
    scrapeIntervalMs: f.scrapeIntervalMs,
    restart: {
      ...(f.restartBackoffMs !== undefined ? { baseMs: f.restartBackoffMs } : {}),
      ...(f.restartMaxBackoffMs !== undefined ? { maxMs: f.restartMaxBackoffMs } : {}),
    },
    ...(f.orphanGraceMs !== undefined ? { orphanGraceMs: f.orphanGraceMs } : {}),
    logger: log.child({ component: "supervisor" }),
    gpus: async () =>
      (await inventory.collect(ownPids())).inventory.gpus.map((g) => ({
        index: g.index,
        memoryTotalMib: g.memoryTotalMiB,
        memoryFreeMib: g.memoryFreeMiB,
      })),
    onStatus: (status) => {
      client()?.send(
        create(AgentMessageSchema, { msg: { case: "shardStatus", value: shardStatusOf(status) } }),
      );
    },
    onLoad: (replicaId, rank, load) => {
      client()?.send(
        create(AgentMessageSchema, { msg: { case: "shardLoad", value: { replicaId, rank, load } } }),
      );
    },
  });
}

function certificateRenewer(
  certs: Certs,
  tls: ClientTls,
  f: AgentFlags,
  log: Logger,
  client: () => StreamClient | undefined,
): InstanceType<Certs["CertificateRenewer"]> {
  return new certs.CertificateRenewer({
    stateDir: f.stateDir,
    node: f.node,
    tls,
    log,
    send: (csrPem) =>
      client()?.send(create(AgentMessageSchema, { msg: { case: "renewCertificate", value: { csrPem } } })) ??
      false,
    onRenewed: (next) => client()?.setTls(next),
  });
}

interface StreamParts {
  instance: string;
  tls: ClientTls | undefined;
  inventory: InventorySource;
  supervisor: Supervisor;
  ownPids: () => Set<number>;
  renewer: InstanceType<Certs["CertificateRenewer"]> | undefined;
  /** The control plane refused the stream because this node's certificate is revoked. */
  onRevoked: () => void;
}

/** The stream to the control plane: Register with the node's inventory and shards, then its commands. */
function streamClient(f: AgentFlags, log: Logger, p: StreamParts): StreamClient {
  const { supervisor, renewer } = p;
  return new StreamClient({
    url: f.controlPlane,
    log,
    pingIntervalMs: f.pingIntervalMs,
    pingTimeoutMs: f.pingTimeoutMs,
    stableAfterMs: f.stableAfterMs,
    ...(p.tls ? { tls: p.tls } : {}),
    register: async () => {
      const { inventory: inv, problems } = await p.inventory.collect(p.ownPids());
      for (const problem of problems) log.warn("inventory problem", { problem });
      return buildRegister({
        nodeName: f.node,
        agentVersion: pkg.version,
        agentInstance: p.instance,
        advertiseAddress: f.advertiseAddress,
        fabric: f.fabric,
        inventory: inv,
        shards: supervisor.list(),
      });
    },
    // Engines nobody claims are stopped only after a grace that starts once
    // a control plane has heard the full list: a control plane outage alone
    // must never stop inference.
    onConnected: () => {
      supervisor.beginOrphanGrace();
      renewer?.reconnected();
      void renewer?.check();
    },
    onScrapeSettings: (s) => supervisor.setScrape(s.intervalMs, s.timeoutMs),
    onReject: (r) => {
      if (r.code === "revoked") p.onRevoked();
    },
    onCommand: (msg) => runCommand(msg, supervisor, renewer, log),
  });
}

/** Not awaited: a stop may take its whole grace, and the stream must keep reading meanwhile. */
function runCommand(
  msg: ControlMessage,
  supervisor: Supervisor,
  renewer: InstanceType<Certs["CertificateRenewer"]> | undefined,
  log: Logger,
): void {
  const m = msg.msg;
  switch (m.case) {
    case "startShard":
      void supervisor.start(m.value);
      break;
    case "stopShard":
      void supervisor.stop(
        m.value.replicaId,
        m.value.reason || "stop requested",
        m.value.graceMs || undefined,
      );
      break;
    case "drainShard":
      void supervisor.drain(m.value.replicaId, m.value.deadlineMs);
      break;
    case "certificateRenewal":
      renewer?.onResult(m.value);
      break;
    default:
      log.warn("unexpected command", { command: m.case });
  }
}

/** --metrics-listen's server, if asked for; "failed" (said on stderr) when it cannot listen. */
async function startMetrics(
  f: AgentFlags,
  log: Logger,
  supervisor: Supervisor,
  client: () => StreamClient | undefined,
): Promise<Server | undefined | "failed"> {
  if (!f.metricsListen) return undefined;
  try {
    const served = await serveMetrics(agentMetrics(supervisor, client), f.metricsListen);
    log.info("serving metrics", { url: `http://${f.metricsListen}/metrics`, port: served.port });
    return served.server;
  } catch (err) {
    process.stderr.write(`llmgw agent: --metrics-listen ${f.metricsListen}: ${errorMessage(err)}\n`);
    return "failed";
  }
}
