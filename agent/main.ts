import { randomUUID } from "node:crypto";
import type { Server } from "node:http";
import { create } from "@bufbuild/protobuf";
import { createLogger, errorMessage } from "../common/log.ts";
import { ownerOnlyDir } from "../common/owner-only.ts";
import pkg from "../package.json" with { type: "json" };
import { AgentMessageSchema } from "../proto/gen/agent/v1/agent_pb.ts";
import type { ClientTls } from "./enroll.ts";
import { AGENT_HELP, type AgentFlags, parseAgentFlags } from "./flags.ts";
import { type InventorySource, nvidiaSmiInventory, simulatedInventory } from "./inventory.ts";
import { agentMetrics, serveMetrics } from "./metrics.ts";
import { lockStateDir } from "./state-lock.ts";
import { StreamClient } from "./stream-client.ts";
import { Supervisor } from "./supervisor.ts";
import { buildRegister, shardStatusOf } from "./wire.ts";

export async function main(argv: string[]): Promise<number> {
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
  const f = flags;
  const instance = randomUUID();
  const log = createLogger({ component: "agent", node: f.node });
  let inventory: InventorySource;
  // Set below; the simulated inventory reads the engines it runs on each collect.
  let supervisor: Supervisor | undefined;
  try {
    inventory = f.simulateGpus
      ? simulatedInventory(f.node, f.simulateGpus, f.simulateForeign, () =>
          (supervisor?.list() ?? []).map((s) => ({
            state: s.state,
            gpuIndices: s.spec?.gpuIndices ?? [],
            gpuMemoryUtilization: s.spec?.gpuMemoryUtilization ?? 0,
          })),
        )
      : nvidiaSmiInventory(f.nvidiaSmi);
  } catch (err) {
    process.stderr.write(`llmgw agent: ${errorMessage(err)}\n`);
    return 2;
  }
  ownerOnlyDir(f.stateDir, log);
  let unlock: () => void;
  try {
    unlock = lockStateDir(f.stateDir);
  } catch (err) {
    process.stderr.write(`llmgw agent: ${errorMessage(err)}\n`);
    return 1;
  }
  if (f.simulateGpus) log.warn("GPUs are simulated", { spec: f.simulateGpus });

  // mTLS: load the stored client certificate, or enroll with the join token.
  // Loaded lazily: plaintext agents never pay for the X.509 code.
  let tls: ClientTls | undefined;
  let certs: typeof import("./enroll.ts") | undefined;
  if (f.controlPlane.startsWith("https://")) {
    certs = await import("./enroll.ts");
    const { loadOrEnrollWithRetry } = certs;
    try {
      tls = await loadOrEnrollWithRetry({
        url: f.controlPlane,
        node: f.node,
        stateDir: f.stateDir,
        joinToken: f.joinToken,
        caFile: f.caFile,
        log,
      });
    } catch (err) {
      log.error("cannot enroll with the control plane", { error: errorMessage(err) });
      process.stderr.write(`llmgw agent: ${errorMessage(err)}\n`);
      unlock();
      return 1;
    }
  } else {
    log.warn(
      "the control plane stream is plaintext h2c: use an https:// control plane with mTLS outside development",
    );
  }

  // Engines run detached and outlive this process; the supervisor re-adopts
  // whatever a previous agent left running before the first Register, so
  // the control plane sees them as running, not missing. Statuses emitted
  // while adopting (before the stream client exists) are dropped: the
  // Register carries the full list.
  let client: StreamClient | undefined;
  supervisor = await Supervisor.open({
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
      client?.send(
        create(AgentMessageSchema, { msg: { case: "shardStatus", value: shardStatusOf(status) } }),
      );
    },
    onLoad: (replicaId, rank, load) => {
      client?.send(
        create(AgentMessageSchema, { msg: { case: "shardLoad", value: { replicaId, rank, load } } }),
      );
    },
  });
  const ownPids = () =>
    new Set(
      supervisor
        .list()
        .map((s) => s.pid)
        .filter((p) => p > 0),
    );

  // Renewal goes over the stream; a revocation ends the agent (it cannot
  // reconnect with the certificate it has, and only an operator with a new
  // join token can re-admit the node).
  let revoked: (() => void) | undefined;
  const stopped = new Promise<number>((resolve) => {
    process.on("SIGINT", () => resolve(0));
    process.on("SIGTERM", () => resolve(0));
    revoked = () => resolve(1);
  });
  const renewer =
    certs && tls
      ? new certs.CertificateRenewer({
          stateDir: f.stateDir,
          node: f.node,
          tls,
          log,
          send: (csrPem) =>
            client?.send(
              create(AgentMessageSchema, { msg: { case: "renewCertificate", value: { csrPem } } }),
            ) ?? false,
          onRenewed: (next) => client?.setTls(next),
        })
      : undefined;
  const renewTimer = renewer ? setInterval(() => void renewer.check(), 3_600_000) : undefined;
  renewTimer?.unref();

  client = new StreamClient({
    url: f.controlPlane,
    log,
    pingIntervalMs: f.pingIntervalMs,
    pingTimeoutMs: f.pingTimeoutMs,
    stableAfterMs: f.stableAfterMs,
    ...(tls ? { tls } : {}),
    register: async () => {
      const { inventory: inv, problems } = await inventory.collect(ownPids());
      for (const p of problems) log.warn("inventory problem", { problem: p });
      return buildRegister({
        nodeName: f.node,
        agentVersion: pkg.version,
        agentInstance: instance,
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
      if (r.code !== "revoked" || !certs) return;
      const aside = certs.setAsideRevoked(f.stateDir);
      log.error(
        "this node's certificate was revoked: stopping; re-admit it with a new join token (llmgw ctl tokens create, then --join-token)",
        { setAside: aside },
      );
      revoked?.();
    },
    onCommand: (msg) => {
      const m = msg.msg;
      // Not awaited: a stop may take its whole grace, and the stream must
      // keep reading meanwhile.
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
    },
  });
  let metricsServer: Server | undefined;
  if (f.metricsListen) {
    try {
      const served = await serveMetrics(
        agentMetrics(supervisor, () => client),
        f.metricsListen,
      );
      metricsServer = served.server;
      log.info("serving metrics", { url: `http://${f.metricsListen}/metrics`, port: served.port });
    } catch (err) {
      process.stderr.write(`llmgw agent: --metrics-listen ${f.metricsListen}: ${errorMessage(err)}\n`);
      supervisor.close();
      unlock();
      return 1;
    }
  }
  log.info("agent starting", { controlPlane: f.controlPlane, instance, pid: process.pid, fabric: f.fabric });
  client.start();
  const code = await stopped;
  if (renewTimer) clearInterval(renewTimer);
  // The stream goes first, so no command can start an engine behind the stop.
  await client.stop();
  metricsServer?.close();
  if (f.stopEnginesOnExit) {
    log.info("stopping engines before exiting (--stop-engines-on-exit)");
    await supervisor.shutdown("agent exiting (--stop-engines-on-exit)");
  } else {
    // Engines are left running: an agent restart must never stop inference.
    supervisor.close();
  }
  unlock();
  return code;
}
