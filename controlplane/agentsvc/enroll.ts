import { Code, ConnectError } from "@connectrpc/connect";
import { formatJoinToken, parseJoinToken } from "../../common/join-token.ts";
import type { Logger } from "../../common/log.ts";
import type { EnrollRequest } from "../../proto/gen/agent/v1/agent_pb.ts";
import { type CertFacts, type CertificateStore, certFacts } from "../certificates.ts";
import type { JoinTokenStore, TokenBinding } from "../join-tokens.ts";
import { type Ca, CsrError, signClientCsr } from "../pki/ca.ts";
import type { ClaimRefusals } from "./claim-refusals.ts";
import { EnrollLimiter } from "./enroll-limit.ts";
import { NODE_NAME } from "./register.ts";

/**
 * AgentService.Enroll and the tokens it accepts: a join token and a CSR
 * whose CN is the node name buy a client certificate for that name. The
 * token is only used once everything else checked out, so a typo in a CSR
 * does not burn a one-time token. Calls are limited per source address.
 * Renewal — a CSR on an authenticated stream, no token — is here too, as
 * is the record of every certificate issued (for revocation).
 *
 * A name is enrolled once: while it holds a certificate that is neither
 * revoked nor expired, Enroll refuses it, unless the token was made to
 * replace that node (`--node NAME --replace`), which revokes the old
 * certificates first. Otherwise a second join token would buy a second
 * certificate for a node that is someone else's.
 */
export interface EnrollmentOptions {
  ca: Ca;
  tokens: JoinTokenStore;
  certs: CertificateStore;
  clientCertValidityMs: number;
  defaultTokenTtlMs: number;
  /** Enroll calls per source address and minute. */
  enrollPerMinute?: number;
  log: Logger;
  now?: () => number;
  /** Where refused claims on a name are kept for `ctl nodes`. */
  claims?: ClaimRefusals;
}

/** Who called Enroll: the TCP peer, and the client certificate it presented, if any. */
export interface EnrollPeer {
  address?: string;
  cert?: CertFacts;
}

/** A node renews at most this often; one in flight per node. */
export const MIN_RENEW_INTERVAL_MS = 60_000;

export interface CreatedToken {
  token: string;
  expiresAt: number;
  uses: number;
  caFingerprint: string;
  binding?: TokenBinding;
}

export const MAX_TOKEN_TTL_MS = 365 * 86_400_000;

/** Refusals that are an attempt on a particular node name, kept for `ctl nodes`. */
const CLAIM_REASONS = new Set(["name_taken", "token_other_node"]);

/** Refuses an Enroll call; typed up front, since control flow only narrows through a declared `never`. */
type Refuse = (reason: string, message: string, code: Code) => never;

export class Enrollment {
  readonly stats = { enrolled: 0, renewed: 0, refused: {} as Record<string, number> };
  private readonly now: () => number;
  private readonly limiter: EnrollLimiter;
  private readonly renewals = new Map<string, { at: number; inFlight: boolean }>();
  /**
   * Revokes a node's certificates, closes its stream and makes it lost —
   * what `ctl nodes revoke` does; server.ts sets it once the streams exist.
   * An enrollment with a replacing token calls it before issuing.
   */
  revokeNode: (node: string) => void = (node) => {
    this.opts.certs.revokeNode(node, this.now());
  };

  constructor(private readonly opts: EnrollmentOptions) {
    this.now = opts.now ?? Date.now;
    this.limiter = new EnrollLimiter(opts.enrollPerMinute ?? 10);
  }

  createToken(ttlMs: number, uses: number, binding?: TokenBinding): CreatedToken {
    const ttl = ttlMs || this.opts.defaultTokenTtlMs;
    const n = uses || 1;
    if (ttl > MAX_TOKEN_TTL_MS)
      throw new ConnectError("a join token may live at most 365d", Code.InvalidArgument);
    if (binding && !NODE_NAME.test(binding.node))
      throw new ConnectError(
        "node: must be 1-63 letters, digits, . _ -, starting alphanumeric",
        Code.InvalidArgument,
      );
    if (binding?.replace && n !== 1)
      throw new ConnectError("a token that replaces a node allows exactly one use", Code.InvalidArgument);
    let created: { secret: string; expiresAt: number };
    try {
      created = this.opts.tokens.create(ttl, n, this.now(), binding);
    } catch (err) {
      throw new ConnectError((err as Error).message, Code.InvalidArgument);
    }
    this.opts.log.info("join token created", {
      expiresAt: new Date(created.expiresAt).toISOString(),
      uses: n,
      ...(binding ? { node: binding.node, replace: binding.replace } : {}),
    });
    return {
      token: formatJoinToken({ secret: created.secret, fingerprint: this.opts.ca.fingerprint }),
      expiresAt: created.expiresAt,
      uses: n,
      caFingerprint: this.opts.ca.fingerprint,
      ...(binding ? { binding } : {}),
    };
  }

  private count(reason: string): void {
    this.stats.refused[reason] = (this.stats.refused[reason] ?? 0) + 1;
  }

  async enroll(req: EnrollRequest, peer: EnrollPeer = {}): Promise<{ certPem: string; caPem: string }> {
    const t = this.now();
    const budget = this.limiter.take(peer.address, t);
    const from = budget.source.key;
    const refuse: Refuse = this.refuser(req.nodeName.slice(0, 64), t, budget.source, from, peer);
    if (!budget.ok) {
      refuse(
        "rate_limited",
        `too many Enroll calls from ${from}: at most ${this.opts.enrollPerMinute ?? 10} a minute; retry in ${Math.ceil(budget.retryInMs / 1000)}s`,
        Code.ResourceExhausted,
      );
    }
    if (peer.cert && this.opts.certs.isRevoked(peer.cert.serial)) {
      refuse(
        "revoked",
        `the client certificate presented (serial ${peer.cert.serial}) is revoked`,
        Code.PermissionDenied,
      );
    }
    if (!NODE_NAME.test(req.nodeName)) {
      refuse(
        "invalid_node_name",
        "node name must be 1-63 letters, digits, . _ -, starting alphanumeric",
        Code.InvalidArgument,
      );
    }
    const secret = this.tokenSecret(req.token, refuse);
    const checked = this.opts.tokens.check(secret, this.now());
    if (!checked.ok) refuse(`token_${checked.reason}`, checked.message, Code.PermissionDenied);
    const binding = checked.binding;
    if (binding && binding.node !== req.nodeName) {
      refuse(
        "token_other_node",
        `this join token was made for node "${binding.node}", not "${req.nodeName}"`,
        Code.PermissionDenied,
      );
    }
    // Checked again after signing: another enrollment may have taken the
    // name while this one waited for the signature.
    this.nameFree(req.nodeName, binding, refuse);
    const certPem = await this.sign(req, refuse);
    const held = this.nameFree(req.nodeName, binding, refuse);
    const used = this.opts.tokens.consume(secret, this.now(), req.nodeName);
    if (!used.ok) refuse(`token_${used.reason}`, used.message, Code.PermissionDenied);
    if (held.length > 0) {
      this.opts.log.warn("enrollment replaces the node's certificates", {
        node: req.nodeName,
        serials: held,
        from,
      });
      this.revokeNode(req.nodeName);
    }
    const facts = certFacts(certPem);
    this.opts.certs.note(facts);
    this.opts.certs.bind(facts, this.now());
    this.stats.enrolled++;
    this.opts.log.info("agent enrolled", {
      node: req.nodeName,
      tokenUsesLeft: used.usesLeft,
      serial: facts.serial,
      from,
      ...(held.length > 0 ? { replaced: held } : {}),
    });
    return { certPem, caPem: this.opts.ca.certPem };
  }

  /**
   * How one Enroll call is refused: counted, charged to its source, noted
   * on the name when it was a claim on it, logged (a flood from one source
   * is one line per window, not one per call), and thrown.
   */
  private refuser(
    node: string,
    t: number,
    source: { failures: number; loggedAt: number },
    from: string,
    peer: EnrollPeer,
  ): Refuse {
    return (reason, message, code) => {
      this.count(reason);
      source.failures++;
      if (CLAIM_REASONS.has(reason))
        this.opts.claims?.note(node, {
          at: t,
          reason,
          from,
          ...(peer.cert ? { serial: peer.cert.serial } : {}),
        });
      const limited = reason === "rate_limited";
      if (!limited || t - source.loggedAt >= 60_000) {
        if (limited) source.loggedAt = t;
        this.opts.log.warn("enrollment refused", {
          node,
          reason,
          message,
          from,
          failuresFromSource: source.failures,
        });
      }
      throw new ConnectError(message, code);
    };
  }

  /** The join token's secret, once it parses and pins this control plane's CA. */
  private tokenSecret(token: string, refuse: Refuse): string {
    try {
      const t = parseJoinToken(token);
      if (t.fingerprint !== this.opts.ca.fingerprint) {
        refuse(
          "wrong_ca",
          `the join token pins CA ${t.fingerprint}, but this control plane's CA is ${this.opts.ca.fingerprint}: the token is from another control plane`,
          Code.PermissionDenied,
        );
      }
      return t.secret;
    } catch (err) {
      if (err instanceof ConnectError) throw err;
      return refuse("malformed_token", (err as Error).message, Code.PermissionDenied);
    }
  }

  /** The serials the name holds; refused when it holds any and the token does not replace them. */
  private nameFree(node: string, binding: TokenBinding | undefined, refuse: Refuse): string[] {
    const held = this.opts.certs.liveSerials(node, this.now());
    if (held.length > 0 && !binding?.replace) {
      refuse(
        "name_taken",
        `node "${node}" already holds a certificate (serial ${held.at(-1)}): revoke it first (llmgw ctl nodes revoke ${node}) or enroll with a token made by llmgw ctl tokens create --node ${node} --replace`,
        Code.PermissionDenied,
      );
    }
    return held;
  }

  private async sign(req: EnrollRequest, refuse: Refuse): Promise<string> {
    try {
      return await signClientCsr(
        this.opts.ca,
        req.csrPem,
        req.nodeName,
        this.opts.clientCertValidityMs,
        this.now,
      );
    } catch (err) {
      if (err instanceof CsrError) refuse("bad_csr", err.message, Code.InvalidArgument);
      throw err;
    }
  }

  /**
   * Renewal over an authenticated stream: `cert` is the certificate the
   * stream was opened with. Same node name, no token; a revoked or lapsed
   * certificate cannot renew (a lapsed one needs a new join token).
   */
  async renew(cert: CertFacts, csrPem: string): Promise<{ certPem: string } | { refused: string }> {
    const node = cert.node;
    const t = this.now();
    const refuse = (reason: string, message: string) => {
      this.count(`renew_${reason}`);
      this.opts.log.warn("certificate renewal refused", { node, reason, message });
      return { refused: message };
    };
    if (this.opts.certs.isRevoked(cert.serial)) return refuse("revoked", "this certificate is revoked");
    if (cert.notAfter <= t)
      return refuse(
        "lapsed",
        `this certificate expired at ${new Date(cert.notAfter).toISOString()}: enroll again with a new join token`,
      );
    const last = this.renewals.get(node);
    if (last?.inFlight) return refuse("busy", "a renewal for this node is already in progress");
    if (last && t - last.at < MIN_RENEW_INTERVAL_MS)
      return refuse(
        "too_soon",
        `this node renewed ${Math.round((t - last.at) / 1000)}s ago: at most one renewal a minute`,
      );
    this.renewals.set(node, { at: t, inFlight: true });
    try {
      const certPem = await signClientCsr(
        this.opts.ca,
        csrPem,
        node,
        this.opts.clientCertValidityMs,
        this.now,
      );
      const facts = certFacts(certPem);
      this.opts.certs.note(facts);
      // The renewed certificate becomes the node's at its first use, unless
      // the node was bound to another one while this signature was made.
      const bound = this.opts.certs.boundSerial(node);
      if (bound === undefined) this.opts.certs.bind(facts, this.now());
      else if (bound === cert.serial) this.opts.certs.renewed(facts);
      this.stats.renewed++;
      this.opts.log.info("agent certificate renewed", {
        node,
        serial: facts.serial,
        previous: cert.serial,
        notAfter: new Date(facts.notAfter).toISOString(),
      });
      return { certPem };
    } catch (err) {
      if (err instanceof CsrError) return refuse("bad_csr", err.message);
      throw err;
    } finally {
      this.renewals.set(node, { at: t, inFlight: false });
    }
  }
}
