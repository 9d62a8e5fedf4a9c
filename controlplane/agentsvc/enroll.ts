import { Code, ConnectError } from "@connectrpc/connect";
import type { Logger } from "../../common/log.ts";
import type { EnrollRequest } from "../../proto/gen/agent/v1/agent_pb.ts";
import type { JoinTokenStore } from "../join-tokens.ts";
import { type Ca, CsrError, signClientCsr } from "../pki/ca.ts";
import { formatJoinToken, parseJoinToken } from "../pki/token.ts";
import { NODE_NAME } from "./register.ts";

/**
 * AgentService.Enroll and the tokens it accepts: a join token and a CSR
 * whose CN is the node name buy a client certificate for that name. The
 * token is only used once everything else checked out, so a typo in a CSR
 * does not burn a one-time token.
 */
export interface EnrollmentOptions {
  ca: Ca;
  tokens: JoinTokenStore;
  clientCertValidityMs: number;
  defaultTokenTtlMs: number;
  log: Logger;
  now?: () => number;
}

export interface CreatedToken {
  token: string;
  expiresAt: number;
  uses: number;
  caFingerprint: string;
}

export const MAX_TOKEN_TTL_MS = 365 * 86_400_000;

export class Enrollment {
  readonly stats = { enrolled: 0, refused: {} as Record<string, number> };
  private readonly now: () => number;

  constructor(private readonly opts: EnrollmentOptions) {
    this.now = opts.now ?? Date.now;
  }

  createToken(ttlMs: number, uses: number): CreatedToken {
    const ttl = ttlMs || this.opts.defaultTokenTtlMs;
    const n = uses || 1;
    if (ttl > MAX_TOKEN_TTL_MS)
      throw new ConnectError("a join token may live at most 365d", Code.InvalidArgument);
    let created: { secret: string; expiresAt: number };
    try {
      created = this.opts.tokens.create(ttl, n, this.now());
    } catch (err) {
      throw new ConnectError((err as Error).message, Code.InvalidArgument);
    }
    this.opts.log.info("join token created", {
      expiresAt: new Date(created.expiresAt).toISOString(),
      uses: n,
    });
    return {
      token: formatJoinToken({ secret: created.secret, fingerprint: this.opts.ca.fingerprint }),
      expiresAt: created.expiresAt,
      uses: n,
      caFingerprint: this.opts.ca.fingerprint,
    };
  }

  private refuse(reason: string, node: string, message: string, code: Code): never {
    this.stats.refused[reason] = (this.stats.refused[reason] ?? 0) + 1;
    this.opts.log.warn("enrollment refused", { node, reason, message });
    throw new ConnectError(message, code);
  }

  async enroll(req: EnrollRequest): Promise<{ certPem: string; caPem: string }> {
    const node = req.nodeName.slice(0, 64);
    if (!NODE_NAME.test(req.nodeName)) {
      this.refuse(
        "invalid_node_name",
        node,
        "node name must be 1-63 letters, digits, . _ -, starting alphanumeric",
        Code.InvalidArgument,
      );
    }
    let secret: string;
    try {
      const t = parseJoinToken(req.token);
      if (t.fingerprint !== this.opts.ca.fingerprint) {
        this.refuse(
          "wrong_ca",
          node,
          `the join token pins CA ${t.fingerprint}, but this control plane's CA is ${this.opts.ca.fingerprint}: the token is from another control plane`,
          Code.PermissionDenied,
        );
      }
      secret = t.secret;
    } catch (err) {
      if (err instanceof ConnectError) throw err;
      this.refuse("malformed_token", node, (err as Error).message, Code.PermissionDenied);
    }
    const checked = this.opts.tokens.check(secret, this.now());
    if (!checked.ok) this.refuse(`token_${checked.reason}`, node, checked.message, Code.PermissionDenied);
    let certPem: string;
    try {
      certPem = await signClientCsr(
        this.opts.ca,
        req.csrPem,
        req.nodeName,
        this.opts.clientCertValidityMs,
        this.now,
      );
    } catch (err) {
      if (err instanceof CsrError) this.refuse("bad_csr", node, err.message, Code.InvalidArgument);
      throw err;
    }
    const used = this.opts.tokens.consume(secret, this.now(), req.nodeName);
    if (!used.ok) this.refuse(`token_${used.reason}`, node, used.message, Code.PermissionDenied);
    this.stats.enrolled++;
    this.opts.log.info("agent enrolled", { node: req.nodeName, tokenUsesLeft: used.usesLeft });
    return { certPem, caPem: this.opts.ca.certPem };
  }
}
