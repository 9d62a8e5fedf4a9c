import { connect } from "node:http2";
import { create, type MessageInitShape, toBinary } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildRegister } from "../../agent/wire.ts";
import { type AgentMessage, AgentMessageSchema } from "../../proto/gen/agent/v1/agent_pb.ts";
import { type ControlPlaneHandle, startAgent, startControlPlane, tempDir } from "../harness/fleet.ts";
import { type Proc, runLlmgw, waitUntil } from "../harness/process.ts";
import { rawAgentStream } from "../harness/raw-agent-stream.ts";

const CONFIG = `
control:
  heartbeat_interval: 300ms
  max_message_bytes: 32768
`;

function register(name: string, gpus = 8, instance = `${name}-raw`) {
  return buildRegister({
    nodeName: name,
    agentVersion: "raw",
    agentInstance: instance,
    advertiseAddress: "127.0.0.1",
    fabric: {},
    shards: [],
    inventory: {
      cpuCores: 1,
      ramTotalMiB: 1,
      hostname: name,
      simulated: true,
      gpus: Array.from({ length: gpus }, (_, i) => ({
        index: i,
        uuid: `GPU-${name}-${i}`.padEnd(100, "x"),
        name: "NVIDIA H100 80GB (simulated)",
        memoryTotalMiB: 81920,
        memoryFreeMiB: 81920,
        memoryUsedMiB: 0,
        pciBusId: "00000000:18:00.0",
        driverVersion: "x",
        computeCapability: "9.0",
        foreign: [],
      })),
    },
  });
}

const rawStream = (url: string, messages: AgentMessage[]) => rawAgentStream(url, messages);

const msg = (m: MessageInitShape<typeof AgentMessageSchema>["msg"]) => create(AgentMessageSchema, { msg: m });

describe("bad input on the agent stream and in the config file", () => {
  let cp: ControlPlaneHandle;
  let good: Proc;

  beforeAll(async () => {
    cp = await startControlPlane(CONFIG);
    good = startAgent(cp, "good", { extra: ["--stable-after", "1s"] });
    await waitUntil("good agent ready", async () => (await cp.nodes()).some((n) => n.name === "good"));
  });
  afterAll(async () => {
    await good?.kill();
    await cp?.proc.kill();
  });

  async function stillServing() {
    const nodes = await cp.nodes();
    expect(nodes.find((n) => n.name === "good")).toMatchObject({ state: "ready", connected: true });
    expect(cp.proc.child.exitCode).toBeNull();
  }

  it("refuses a stream whose first message is not Register", async () => {
    const r = await rawStream(cp.agentUrl, [msg({ case: "heartbeat", value: { sentAtUnixMs: 1n } })]);
    expect(r.received[0]?.msg).toMatchObject({ case: "reject", value: { code: "protocol" } });
    await stillServing();
  });

  it("refuses an invalid Register with a path-named reason", async () => {
    const r = await rawStream(cp.agentUrl, [msg({ case: "register", value: register("../etc/passwd") })]);
    expect(r.received[0]?.msg).toMatchObject({ case: "reject", value: { code: "invalid_register" } });
    expect((r.received[0]!.msg.value as { message: string }).message).toMatch(
      /^register\.nodeName: node name/,
    );
    const dup = register("dup-gpus");
    dup.inventory!.gpus[1]!.index = 0;
    const r2 = await rawStream(cp.agentUrl, [msg({ case: "register", value: dup })]);
    expect((r2.received[0]!.msg.value as { message: string }).message).toMatch(/duplicate GPU index/);
    await stillServing();
  });

  it("drops an oversized message without disturbing other nodes", async () => {
    // 256 GPUs with long uuids: well over the 32 KiB max_message_bytes.
    const big = register("huge", 256);
    expect(toBinary(AgentMessageSchema, msg({ case: "register", value: big })).length).toBeGreaterThan(32768);
    const r = await rawStream(cp.agentUrl, [msg({ case: "register", value: big })]);
    expect(r.received).toEqual([]);
    expect(r.error).toMatch(/resource_exhausted|exceeds|max/i);
    expect((await cp.nodes()).some((n) => n.name === "huge")).toBe(false);
    await stillServing();
  });

  it("survives bytes that are not a protobuf message", async () => {
    const session = connect(cp.agentUrl);
    const status = await new Promise<string>((resolve, reject) => {
      const req = session.request({
        ":method": "POST",
        ":path": "/agent.v1.AgentService/Connect",
        "content-type": "application/connect+proto",
      });
      // A valid envelope (flags 0, length 16) around garbage bytes.
      const payload = Buffer.from(
        "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        "latin1",
      );
      const head = Buffer.alloc(5);
      head.writeUInt32BE(payload.length, 1);
      req.end(Buffer.concat([head, payload]));
      let body = "";
      req.on("data", (c: Buffer) => {
        body += c.toString("latin1");
      });
      req.on("end", () => resolve(body));
      req.on("error", reject);
    });
    session.close();
    expect(status).toMatch(/invalid_argument|internal|protobuf|premature|invalid/i);
    await stillServing();
  });

  it("refuses a second agent claiming the name of a connected node", async () => {
    const refusals = () => cp.metric('llmgw_agent_rejections_total{reason="name_in_use"}');
    const before = await refusals();
    const impostor = startAgent(cp, "good", { stateDir: tempDir("impostor") });
    await waitUntil("the impostor refused", async () => (await refusals()) > before, 15_000);
    await impostor.kill();
    await stillServing();
    const first = (await cp.nodes()).find((n) => n.name === "good")!;
    // The original agent still owns the node.
    expect(first.agentVersion).not.toBe("raw");
    const again = await cp.ctl("node", "good");
    expect(JSON.parse(again.stdout).agentInstance).toBe(first.agentInstance);
  });

  it("rejects unknown keys and wrong types in the config file with path-named errors", async () => {
    const dir = tempDir("badcfg");
    const path = `${dir}/bad.yaml`;
    const { writeFileSync } = await import("node:fs");
    writeFileSync(path, "control:\n  lost_aftr: 5s\n  interval: 5\nrouter:\n  retries: many\n");
    const r = await runLlmgw(["server", "--config", path]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("control.lost_aftr: unknown key");
    expect(r.stderr).toContain("control.interval: a duration needs a unit");
    expect(r.stderr).toContain("router.retries: Invalid input: expected number, received string");
    const env = await runLlmgw(["server", "--config", path], { LLMGW_CONTROL__LOST_AFTER: "soon" });
    expect(env.code).toBe(1);
    await stillServing();
  });
});
