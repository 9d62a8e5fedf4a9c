/**
 * The listener agents dial: the one long-lived stream every node holds
 * (served by AgentStreams' own lean handler, connect-bidi.ts) and, through
 * connect's router, every other AgentService call (Enroll). With mTLS its
 * CA, certificate and the stores enrollment needs live here too.
 */
import {
  createServer as createHttp2Server,
  createSecureServer,
  type Http2SecureServer,
  type Http2Server,
  type Http2ServerRequest,
} from "node:http2";
import { hostname } from "node:os";
import { join } from "node:path";
import type { TLSSocket } from "node:tls";
import {
  Code,
  ConnectError,
  type ConnectRouter,
  createContextKey,
  createContextValues,
} from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import type { Logger } from "../common/log.ts";
import { AgentService } from "../proto/gen/agent/v1/agent_pb.ts";
import { type AgentStreams, CONNECT_PATH } from "./agentsvc/agent-streams.ts";
import type { ClaimRefusals } from "./agentsvc/claim-refusals.ts";
import { Enrollment, type EnrollPeer } from "./agentsvc/enroll.ts";
import { type CertFacts, CertificateStore, certFacts } from "./certificates.ts";
import type { LoadedConfig } from "./config/load.ts";
import type { ListenersConfig } from "./config/schema.ts";
import { JoinTokenStore } from "./join-tokens.ts";
import { guardAgentListener, type ListenerGuard } from "./listener/guard.ts";
import { type Ca, ensureServerCert, loadOrCreateCa, type ServerCert } from "./pki/ca.ts";

export interface AgentTls {
  ca: Ca;
  tokens: JoinTokenStore;
  certs: CertificateStore;
  enrollment: Enrollment;
  /** key, cert chain and CA for the listener's secure context. */
  context(): { key: string; cert: string; ca: string };
  /** Issues the server certificate again when due; true when it did. */
  renew(): Promise<boolean>;
}

/** The SANs of the agent listener's certificate when the config names none. */
export function defaultTlsHostnames(configured: readonly string[] | undefined): string[] {
  return configured ? [...configured] : [hostname(), "localhost", "127.0.0.1"];
}

/** The CA, the listener's certificate and the token store, under data_dir. */
export async function setUpAgentTls(
  loaded: LoadedConfig,
  log: Logger,
  now: () => number,
  claims?: ClaimRefusals,
): Promise<AgentTls> {
  const { config } = loaded;
  const t = config.agent_tls;
  const hostnames = defaultTlsHostnames(t.hostnames);
  const dir = join(config.data_dir, "pki");
  const { ca, created } = await loadOrCreateCa(dir, now);
  if (created) log.info("created the agent CA", { dir, fingerprint: ca.fingerprint });
  let server: ServerCert | undefined;
  const issue = async (): Promise<boolean> => {
    const next = await ensureServerCert(ca, dir, hostnames, now);
    if (next.issued)
      log.info("issued the agent listener certificate", {
        reason: next.issued,
        hostnames,
        notAfter: next.notAfter.toISOString(),
      });
    server = next;
    return next.issued !== undefined;
  };
  await issue();
  const tokens = new JoinTokenStore(join(config.data_dir, "llmgw.db"));
  const certs = new CertificateStore(join(config.data_dir, "llmgw.db"));
  if (created) {
    const forgotten = certs.forgetAll();
    if (forgotten > 0) log.warn("a new agent CA: forgot the certificates of the old one", { forgotten });
  }
  const enrollment = new Enrollment({
    ca,
    tokens,
    certs,
    enrollPerMinute: t.enroll_per_minute,
    clientCertValidityMs: t.client_cert_validity,
    defaultTokenTtlMs: t.join_token_ttl,
    log: log.child({ component: "enroll" }),
    now,
    ...(claims ? { claims } : {}),
  });
  return {
    ca,
    tokens,
    certs,
    enrollment,
    // The chain includes the CA, so an agent holding only a join token can
    // read the CA certificate off the handshake and check its fingerprint.
    context: () => ({
      key: server!.keyPem,
      cert: `${server!.certPem.trim()}\n${ca.certPem.trim()}\n`,
      ca: ca.certPem,
    }),
    renew: issue,
  };
}

/** The Enroll caller, handed from the TLS socket to the connect handler. */
const enrollPeerKey = createContextKey<EnrollPeer>({}, { description: "the Enroll caller" });

export interface AgentListener {
  server: Http2Server | Http2SecureServer;
  /** Its connection caps and idle rules, for /metrics. */
  guard: ListenerGuard;
  /** Stops renewing the listener's certificate. */
  stop(): void;
}

export function agentListener(
  streams: AgentStreams,
  tls: AgentTls | undefined,
  readMaxBytes: number,
  log: Logger,
  limits: ListenersConfig,
): AgentListener {
  const router = connectNodeAdapter({
    routes: (r: ConnectRouter) => {
      r.service(AgentService, {
        connect: () => {
          throw new ConnectError("served by the stream handler", Code.Internal);
        },
        enroll: (req, ctx) => {
          if (!tls) {
            throw new ConnectError(
              "enrollment (mTLS) is not enabled on this control plane (agent_tls.enabled)",
              Code.Unimplemented,
            );
          }
          return tls.enrollment.enroll(req, ctx.values.get(enrollPeerKey));
        },
      });
    },
    readMaxBytes,
    contextValues: (req) => {
      const cert = peerCertificate(req as Http2ServerRequest);
      return createContextValues().set(enrollPeerKey, {
        ...(req.socket.remoteAddress ? { address: req.socket.remoteAddress } : {}),
        ...(cert ? { cert } : {}),
      });
    },
  });
  if (!tls) {
    const server = createHttp2Server({}, (req, res) => {
      if (req.url === CONNECT_PATH) streams.handle(req, res);
      else router(req, res);
    });
    return { server, guard: guardAgentListener(server, limits, log), stop() {} };
  }
  // With mTLS every client may connect (rejectUnauthorized: false) so that
  // a new agent can call Enroll; the stream itself demands a certificate.
  const server = createSecureServer(
    {
      ...tls.context(),
      requestCert: true,
      rejectUnauthorized: false,
      allowHTTP1: false,
      handshakeTimeout: limits.auth_timeout,
    },
    (req, res) => {
      if (req.url === CONNECT_PATH) streams.handle(req, res, peerCertificate(req));
      else router(req, res);
    },
  );
  // The server certificate is checked again twice a day, so one that nears
  // expiry on a long-running control plane is replaced without a restart.
  const timer = setInterval(() => {
    tls
      .renew()
      .then((renewed) => {
        if (renewed) server.setSecureContext(tls.context());
      })
      .catch((err) => log.error("agent listener certificate renewal failed", { error: String(err) }));
  }, 12 * 3_600_000);
  timer.unref();
  return { server, guard: guardAgentListener(server, limits, log), stop: () => clearInterval(timer) };
}

const CLIENT_AUTH = "1.3.6.1.5.5.7.3.2";

/**
 * The certificate a TLS peer authenticated with: a client certificate that
 * chains to our CA, is in its validity period and is meant for client
 * authentication. Its CN is the one node the peer may speak for. Undefined
 * for anyone else (no certificate, another CA, an expired one, the server's
 * own certificate).
 */
function peerCertificate(req: Http2ServerRequest): CertFacts | undefined {
  const socket = req.socket as TLSSocket;
  if (!socket.authorized || typeof socket.getPeerCertificate !== "function") return undefined;
  const cert = socket.getPeerCertificate();
  if (!cert?.raw || !cert.ext_key_usage?.includes(CLIENT_AUTH)) return undefined;
  const facts = certFacts(cert.raw);
  return facts.node ? facts : undefined;
}
