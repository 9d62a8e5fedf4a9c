import type { Http2ServerRequest, Http2ServerResponse } from "node:http2";
import { type DescMessage, fromBinary, type MessageShape, toBinary } from "@bufbuild/protobuf";

/**
 * The server side of one Connect bidirectional stream, written against the
 * protocol (connectrpc.com/docs/protocol, "Streaming RPC") rather than
 * through connect-node's router.
 *
 * Why: the agent stream is the one RPC held open by every node of the fleet
 * at once. connect-node's generic pipeline costs some twenty async generators
 * and their promises per open stream — about 40 KiB of heap each — which at a
 * thousand agents is most of the control plane's memory. This handler keeps a
 * buffer and two callbacks per stream. Agents still use the stock
 * connect-node client, so the wire format is the library's, and every other
 * RPC still goes through the router.
 */
const FLAG_COMPRESSED = 0b01;
const FLAG_END_STREAM = 0b10;

/** Connect error codes, as the end-stream JSON spells them. */
export type ConnectCode =
  | "canceled"
  | "invalid_argument"
  | "deadline_exceeded"
  | "not_found"
  | "already_exists"
  | "permission_denied"
  | "resource_exhausted"
  | "failed_precondition"
  | "unimplemented"
  | "internal"
  | "unavailable";

export interface BidiStream<O> {
  send(msg: O): boolean;
  /** Ends the response: cleanly, or with an error the client raises as ConnectError. */
  end(error?: { code: ConnectCode; message: string }): void;
  readonly ended: boolean;
}

export interface BidiCallbacks<I> {
  onMessage(msg: I): void;
  /** The client half-closed, the stream was reset, or `end` was called. */
  onClose(reason: string): void;
}

export interface BidiOptions<I extends DescMessage, O extends DescMessage> {
  input: I;
  output: O;
  readMaxBytes: number;
  open(stream: BidiStream<MessageShape<O>>): BidiCallbacks<MessageShape<I>>;
}

function envelope(flags: number, payload: Uint8Array): Buffer {
  const b = Buffer.allocUnsafe(5 + payload.length);
  b[0] = flags;
  b.writeUInt32BE(payload.length, 1);
  b.set(payload, 5);
  return b;
}

export function serveConnectBidi<I extends DescMessage, O extends DescMessage>(
  req: Http2ServerRequest,
  res: Http2ServerResponse,
  opts: BidiOptions<I, O>,
): void {
  const contentType = String(req.headers["content-type"] ?? "");
  if (req.method !== "POST" || !/^application\/connect\+proto\b/.test(contentType)) {
    // A wrong codec or a plain HTTP probe is answered at the HTTP level; the
    // Connect client maps 415 to Unimplemented.
    res.writeHead(415, { "content-type": "text/plain" });
    res.end(
      "this endpoint speaks the Connect streaming protocol with protobuf (application/connect+proto)\n",
    );
    return;
  }
  res.writeHead(200, { "content-type": "application/connect+proto" });
  let ended = false;
  let closed = false;
  const stream: BidiStream<MessageShape<O>> = {
    get ended() {
      return ended;
    },
    send(msg) {
      if (ended) return false;
      res.write(envelope(0, toBinary(opts.output, msg)));
      return true;
    },
    end(error) {
      if (ended) return;
      ended = true;
      const body = error ? { error } : {};
      res.end(envelope(FLAG_END_STREAM, Buffer.from(JSON.stringify(body))));
      close("response ended");
    },
  };
  const callbacks = opts.open(stream);
  const close = (reason: string) => {
    if (closed) return;
    closed = true;
    callbacks.onClose(reason);
  };

  let buffered: Buffer = Buffer.alloc(0);
  req.on("data", (chunk: Buffer) => {
    if (ended) return;
    buffered = buffered.length === 0 ? chunk : Buffer.concat([buffered, chunk]);
    while (buffered.length >= 5 && !ended) {
      const flags = buffered[0]!;
      const length = buffered.readUInt32BE(1);
      if (length > opts.readMaxBytes) {
        stream.end({
          code: "resource_exhausted",
          message: `message size ${length} exceeds the limit of ${opts.readMaxBytes} bytes`,
        });
        return;
      }
      if (buffered.length < 5 + length) return;
      const payload = buffered.subarray(5, 5 + length);
      buffered = buffered.subarray(5 + length);
      if (flags & FLAG_COMPRESSED) {
        stream.end({ code: "unimplemented", message: "compressed messages are not accepted on this stream" });
        return;
      }
      if (flags & FLAG_END_STREAM) continue;
      let msg: MessageShape<I>;
      try {
        msg = fromBinary(opts.input, payload);
      } catch (err) {
        stream.end({ code: "invalid_argument", message: `cannot decode message: ${(err as Error).message}` });
        return;
      }
      callbacks.onMessage(msg);
    }
    // Keep only the unread tail, so a long-lived stream does not pin the
    // chunk it came in.
    if (buffered.length > 0 && buffered.byteOffset > 0) buffered = Buffer.from(buffered);
  });
  req.on("end", () => {
    // The agent half-closed: it will send nothing more, so the session is
    // over. Finish the response so the client sees a clean end.
    stream.end();
  });
  req.on("close", () => {
    ended = true;
    close("stream closed");
  });
  res.on("error", () => close("response failed"));
}
