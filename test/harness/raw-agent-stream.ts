import { connect } from "node:http2";
import { fromBinary } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { AsyncQueue } from "../../common/async-queue.ts";
import {
  type AgentMessage,
  AgentService,
  type ControlMessage,
  ControlMessageSchema,
} from "../../proto/gen/agent/v1/agent_pb.ts";

/**
 * Opens one agent stream by hand, sends `messages`, and collects what comes
 * back until the server ends it (or `timeoutMs` passes): how tests play a
 * broken or hostile agent that the real one would never be.
 */
export async function rawAgentStream(
  url: string,
  messages: AgentMessage[],
  opts: { tls?: { ca: string; cert?: string; key?: string }; timeoutMs?: number } = {},
): Promise<{ received: ControlMessage[]; error?: string }> {
  const transport = createConnectTransport({
    baseUrl: url,
    httpVersion: "2",
    ...(opts.tls ? { nodeOptions: opts.tls } : {}),
  });
  const client = createClient(AgentService, transport);
  const out = new AsyncQueue<AgentMessage>();
  for (const m of messages) out.push(m);
  const received: ControlMessage[] = [];
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), opts.timeoutMs ?? 3_000);
  try {
    for await (const m of client.connect(out, { signal: ac.signal })) {
      received.push(m);
      if (m.msg.case === "registerAck") out.close();
    }
    return { received };
  } catch (err) {
    return { received, error: String(err) };
  } finally {
    clearTimeout(timer);
  }
}

export interface RawStreamResult {
  /** HTTP status of the response (0: none). */
  status: number;
  /** Data envelopes, decoded; `undefined` where a payload did not decode. */
  messages: (ControlMessage | undefined)[];
  /** The end-of-stream envelope's JSON, when one came. */
  end?: { error?: { code?: string; message?: string } };
  /** The server did not finish the response within the timeout. */
  timedOut: boolean;
  /** The HTTP/2 stream or session failed (reset, refused). */
  transportError?: string;
}

/**
 * One Connect stream at the byte level: `frames` are written as they are
 * (envelopes included, so a test can lie about flags and lengths), then the
 * request side ends after `holdMs`, and the response is read until the
 * server ends it. How the fuzz tests play an agent no library would let them
 * be.
 */
export async function rawConnectFrames(
  url: string,
  frames: Uint8Array[],
  opts: { tls?: { ca: string; cert?: string; key?: string }; holdMs?: number; timeoutMs?: number } = {},
): Promise<RawStreamResult> {
  const session = connect(url, opts.tls ? { ...opts.tls } : {});
  const result: RawStreamResult = { status: 0, messages: [], timedOut: false };
  try {
    await new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        result.timedOut = true;
        resolve();
      }, opts.timeoutMs ?? 5_000);
      const done = () => {
        clearTimeout(timer);
        resolve();
      };
      session.on("error", (e) => {
        result.transportError = e.message;
        done();
      });
      const req = session.request({
        ":method": "POST",
        ":path": "/agent.v1.AgentService/Connect",
        "content-type": "application/connect+proto",
        "connect-protocol-version": "1",
      });
      req.on("response", (h) => {
        result.status = Number(h[":status"] ?? 0);
      });
      let body = Buffer.alloc(0);
      req.on("data", (c: Buffer) => {
        body = Buffer.concat([body, c]);
        while (body.length >= 5) {
          const len = body.readUInt32BE(1);
          if (body.length < 5 + len) break;
          const flags = body[0]!;
          const payload = body.subarray(5, 5 + len);
          body = body.subarray(5 + len);
          if (flags & 0b10) {
            try {
              result.end = JSON.parse(payload.toString("utf8"));
            } catch {
              result.end = { error: { code: "unparsable end-stream", message: payload.toString("utf8") } };
            }
          } else {
            try {
              result.messages.push(fromBinary(ControlMessageSchema, payload));
            } catch {
              result.messages.push(undefined);
            }
          }
        }
      });
      req.on("end", done);
      req.on("close", done);
      req.on("error", (e) => {
        result.transportError = e.message;
        done();
      });
      for (const f of frames) req.write(f);
      setTimeout(() => req.end(), opts.holdMs ?? 0);
    });
  } finally {
    session.destroy();
  }
  return result;
}

/** A Connect envelope around `payload`: flags byte, 32-bit length (which may lie), payload. */
export function envelope(payload: Uint8Array, flags = 0, length = payload.length): Buffer {
  const head = Buffer.alloc(5);
  head[0] = flags;
  head.writeUInt32BE(length >>> 0, 1);
  return Buffer.concat([head, payload]);
}
