/**
 * The agent's side of mTLS enrollment (docs/architecture.md, the control
 * path; docs/security.md). On the first start against an https:// control
 * plane the state dir holds no certificate: the agent makes a P-256 key and
 * a CSR for its node name, pins the control plane's CA (the fingerprint in
 * the join token, or --ca-file), and trades token and CSR for a client
 * certificate over TLS. Every later start just loads `agent.key`,
 * `agent.crt` and `ca.crt` from the state dir. Before the certificate runs
 * out, the agent renews it over its stream (no token); a revoked one is set
 * aside as `agent.crt.revoked`.
 */
import { createPublicKey, X509Certificate } from "node:crypto";
import { existsSync, readFileSync, renameSync, rmSync } from "node:fs";
import { isIP } from "node:net";
import { join } from "node:path";
import { type PeerCertificate, connect as tlsConnect } from "node:tls";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { writeFileAtomic } from "../common/atomic-write.ts";
import { parseJoinToken } from "../common/join-token.ts";
import { errorMessage, type Logger } from "../common/log.ts";
import { createCsr, sha256Hex } from "../common/x509.ts";
import { AgentService, type CertificateRenewal } from "../proto/gen/agent/v1/agent_pb.ts";
import { tlsHint } from "./tls-hint.ts";

export interface ClientTls {
  key: string;
  cert: string;
  ca: string;
}

/** A problem retrying cannot fix: the agent says what to do and exits. */
export class EnrollError extends Error {}

export interface EnrollOptions {
  url: string;
  node: string;
  stateDir: string;
  joinToken: string | undefined;
  caFile: string | undefined;
  log: Logger;
  now?: () => number;
}

export const stateFiles = (dir: string) => ({
  key: join(dir, "agent.key"),
  cert: join(dir, "agent.crt"),
  ca: join(dir, "ca.crt"),
  revoked: join(dir, "agent.crt.revoked"),
});

/**
 * Renewal starts when less than a third of the certificate's lifetime is
 * left (kubelet rotates at 70–90 %): long before expiry, so a control plane
 * that is away for a while does not cost the node its identity.
 */
export function renewalDue(certPem: string, now: number): boolean {
  const c = new X509Certificate(certPem);
  const from = Date.parse(c.validFrom);
  const to = Date.parse(c.validTo);
  return to - now < (to - from) / 3;
}

function pemFingerprint(pem: string): string {
  return sha256Hex(new X509Certificate(pem).raw);
}

/** The client certificate to connect with: stored, or enrolled now. */
export async function loadOrEnroll(o: EnrollOptions): Promise<ClientTls> {
  const files = stateFiles(o.stateDir);
  const now = o.now ?? Date.now;
  if (existsSync(files.key) && existsSync(files.cert) && existsSync(files.ca)) {
    const tls = {
      key: readFileSync(files.key, "utf8"),
      cert: readFileSync(files.cert, "utf8"),
      ca: readFileSync(files.ca, "utf8"),
    };
    let cert: X509Certificate;
    try {
      cert = new X509Certificate(tls.cert);
    } catch (err) {
      throw new EnrollError(
        `${files.cert} is not a usable certificate (${(err as Error).message}): restore the state directory, or remove ${files.cert} and enroll again with a new --join-token (llmgw ctl tokens create)`,
      );
    }
    const cn = /(?:^|\n)CN=([^\n]*)/.exec(cert.subject)?.[1];
    const expires = Date.parse(cert.validTo);
    if (expires <= now()) {
      if (!o.joinToken) {
        throw new EnrollError(
          `the client certificate in ${files.cert} expired at ${new Date(expires).toISOString()}: enroll again with a new --join-token (llmgw ctl tokens create)`,
        );
      }
      o.log.warn("client certificate expired: enrolling again", { expired: new Date(expires).toISOString() });
    } else {
      if (cn !== o.node) {
        o.log.warn("the stored client certificate is for another node: the control plane will refuse it", {
          certificate: cn,
          node: o.node,
          file: files.cert,
        });
      }
      if (o.joinToken) o.log.info("already enrolled: --join-token is not needed and was ignored");
      o.log.info("using the stored client certificate", {
        node: cn,
        expires: new Date(expires).toISOString(),
      });
      return tls;
    }
  }
  if (!o.joinToken) {
    if (existsSync(files.revoked)) {
      throw new EnrollError(
        `this node's certificate was revoked (${files.revoked}): re-admit it with a new join token (llmgw ctl tokens create) and --join-token`,
      );
    }
    throw new EnrollError(
      `no client certificate in ${o.stateDir} and no --join-token: create one with \`llmgw ctl tokens create\` and start the agent once with --join-token TOKEN`,
    );
  }
  return enroll(o, o.joinToken);
}

/** The control plane revoked this node: keep the certificate for the record, out of the way of the next enrollment. */
export function setAsideRevoked(stateDir: string): string {
  const files = stateFiles(stateDir);
  if (existsSync(files.cert)) renameSync(files.cert, files.revoked);
  return files.revoked;
}

async function enroll(o: EnrollOptions, joinToken: string): Promise<ClientTls> {
  let token: ReturnType<typeof parseJoinToken>;
  try {
    token = parseJoinToken(joinToken);
  } catch (err) {
    throw new EnrollError(errorMessage(err));
  }
  let caPem: string;
  if (o.caFile) {
    caPem = readFileSync(o.caFile, "utf8");
    const fp = pemFingerprint(caPem);
    if (fp !== token.fingerprint) {
      throw new EnrollError(
        `CA fingerprint mismatch: ${o.caFile} has sha256 ${fp}, the join token expects ${token.fingerprint}`,
      );
    }
  } else {
    caPem = await pinCa(o.url, token.fingerprint);
  }
  o.log.info("enrolling with the control plane", { caFingerprint: token.fingerprint });
  const { keyPem, csrPem } = await createCsr(o.node);
  const transport = createConnectTransport({ baseUrl: o.url, httpVersion: "2", nodeOptions: { ca: caPem } });
  let res: { certPem: string; caPem: string };
  try {
    res = await createClient(AgentService, transport).enroll(
      { token: joinToken.trim(), nodeName: o.node, csrPem },
      { timeoutMs: 15_000 },
    );
  } catch (err) {
    if (
      err instanceof ConnectError &&
      [Code.PermissionDenied, Code.InvalidArgument, Code.Unimplemented, Code.Unauthenticated].includes(
        err.code,
      )
    ) {
      throw new EnrollError(`enrollment refused by the control plane: ${err.rawMessage}`);
    }
    const hint = tlsHint(err, o.url);
    if (hint) throw new EnrollError(`cannot enroll: ${hint} (${errorMessage(err)})`);
    throw err;
  }
  if (pemFingerprint(res.caPem) !== token.fingerprint)
    throw new EnrollError("the control plane returned a CA other than the one the join token pins");
  const cert = new X509Certificate(res.certPem);
  if (!cert.checkIssued(new X509Certificate(res.caPem)))
    throw new EnrollError("the control plane returned a certificate its CA did not issue");
  const files = stateFiles(o.stateDir);
  // agent.crt last: its presence is what "enrolled" means on the next start.
  writeFileAtomic(files.ca, res.caPem);
  writeFileAtomic(files.key, keyPem, 0o600);
  writeFileAtomic(files.cert, res.certPem);
  rmSync(files.revoked, { force: true });
  o.log.info("enrolled: client certificate stored", { file: files.cert, expires: cert.validTo });
  return { key: keyPem, cert: res.certPem, ca: res.caPem };
}

/**
 * Reads the certificate chain the control plane presents (without trusting
 * it) and returns, as PEM, the one whose DER hashes to `fingerprint`. The
 * Enroll call then verifies the server properly against that CA.
 */
export async function pinCa(url: string, fingerprint: string): Promise<string> {
  const u = new URL(url);
  const port = Number(u.port || 443);
  const host = u.hostname.replace(/^\[|\]$/g, "");
  const chain = await new Promise<Buffer[]>((resolve, reject) => {
    const socket = tlsConnect({
      host,
      port,
      ...(isIP(host) ? {} : { servername: host }),
      rejectUnauthorized: false,
      ALPNProtocols: ["h2"],
    });
    socket.setTimeout(10_000, () => socket.destroy(new Error(`TLS handshake with ${u.host} timed out`)));
    socket.once("error", reject);
    socket.once("secureConnect", () => {
      const out: Buffer[] = [];
      let c: PeerCertificate | undefined = socket.getPeerCertificate(true);
      const seen = new Set<PeerCertificate>();
      while (c?.raw && !seen.has(c)) {
        seen.add(c);
        out.push(c.raw);
        c = (c as { issuerCertificate?: PeerCertificate }).issuerCertificate;
      }
      socket.end();
      resolve(out);
    });
  });
  const ca = chain.find((der) => sha256Hex(der) === fingerprint);
  if (!ca) {
    throw new EnrollError(
      `CA fingerprint mismatch: the control plane at ${u.host} presents ${chain.map((d) => sha256Hex(d)).join(", ") || "no certificate"}, the join token expects ${fingerprint} — a wrong address, another control plane, or someone in between`,
    );
  }
  return new X509Certificate(ca).toString();
}

/** Enrolls, retrying while the control plane is unreachable; EnrollError is final. */
export async function loadOrEnrollWithRetry(o: EnrollOptions): Promise<ClientTls> {
  let delay = 1_000;
  for (;;) {
    try {
      return await loadOrEnroll(o);
    } catch (err) {
      if (err instanceof EnrollError) throw err;
      o.log.warn("enrollment failed, retrying", { error: errorMessage(err), inMs: delay });
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 30_000);
    }
  }
}

export interface RenewerOptions {
  stateDir: string;
  node: string;
  tls: ClientTls;
  log: Logger;
  /** Sends a RenewCertificate on the live stream; false while disconnected. */
  send: (csrPem: string) => boolean;
  /** The renewed certificate is stored: connect with it from now on. */
  onRenewed: (tls: ClientTls) => void;
  now?: () => number;
}

/**
 * Renews the client certificate over the authenticated stream: a CSR for
 * the key the agent already has (so only `agent.crt` changes, in one atomic
 * rename), answered with a certificate from the same CA. `check` runs on
 * every connect and hourly; a refusal is logged and tried again an hour on.
 */
export class CertificateRenewer {
  private inFlight = false;
  private tls: ClientTls;
  private readonly now: () => number;

  constructor(private readonly o: RenewerOptions) {
    this.tls = o.tls;
    this.now = o.now ?? Date.now;
  }

  /** A new stream: whatever was asked on the old one will not be answered. */
  reconnected(): void {
    this.inFlight = false;
  }

  async check(): Promise<void> {
    if (this.inFlight || !renewalDue(this.tls.cert, this.now())) return;
    this.inFlight = true;
    try {
      const { csrPem } = await createCsr(this.o.node, this.tls.key);
      this.inFlight = this.o.send(csrPem);
      if (this.inFlight)
        this.o.log.info("renewing the client certificate", {
          expires: new X509Certificate(this.tls.cert).validTo,
        });
    } catch (err) {
      this.inFlight = false;
      this.o.log.error("cannot make a renewal CSR", { error: errorMessage(err) });
    }
  }

  onResult(r: CertificateRenewal): void {
    this.inFlight = false;
    if (r.result.case !== "certPem") {
      this.o.log.warn("client certificate renewal refused; trying again in an hour", {
        reason: r.result.case === "refused" ? r.result.value : "empty answer",
      });
      return;
    }
    const problem = this.problem(r.result.value);
    if (problem) {
      this.o.log.error("the control plane answered the renewal with an unusable certificate", { problem });
      return;
    }
    const files = stateFiles(this.o.stateDir);
    writeFileAtomic(files.cert, r.result.value);
    this.tls = { ...this.tls, cert: r.result.value };
    this.o.log.info("client certificate renewed", {
      file: files.cert,
      expires: new X509Certificate(r.result.value).validTo,
    });
    this.o.onRenewed(this.tls);
  }

  private problem(certPem: string): string | undefined {
    let cert: X509Certificate;
    try {
      cert = new X509Certificate(certPem);
    } catch (err) {
      return `cannot parse it: ${errorMessage(err)}`;
    }
    const ca = new X509Certificate(this.tls.ca);
    if (!cert.checkIssued(ca) || !cert.verify(ca.publicKey)) return "not issued by the CA this agent trusts";
    if (/(?:^|\n)CN=([^\n]*)/.exec(cert.subject)?.[1] !== this.o.node) return `not for node ${this.o.node}`;
    const der = (k: ReturnType<typeof createPublicKey>) => k.export({ type: "spki", format: "der" });
    if (!der(cert.publicKey).equals(der(createPublicKey(this.tls.key)))) return "not for this agent's key";
    return undefined;
  }
}
