/**
 * Who may call ControlService (docs/security.md). With a token configured,
 * every call needs `Authorization: Bearer <token>`; the calls access.ts
 * opens to read_only_networks may instead come from a network the operator
 * trusts. Without a token the API is open, which the server only
 * allows on a loopback admin_listen or with --insecure-admin.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { readFileSync } from "node:fs";
import { BlockList, isIPv4, isIPv6 } from "node:net";
import type { DescMethod } from "@bufbuild/protobuf";
import { Code, ConnectError, createContextKey, type Interceptor } from "@connectrpc/connect";
import { parseListen } from "../../common/listen.ts";
import type { AdminConfig } from "../config/schema.ts";
import { opensToReadOnlyNetworks } from "./access.ts";

/** A configuration the control plane must not start with; the message says what to fix. */
export class AdminAuthError extends Error {}

export const MIN_TOKEN_LENGTH = 16;

export interface AdminTokens {
  tokens: string[];
  /** Where they came from, for the log: `file PATH`, `$VAR`, or `none`. */
  source: string;
}

/**
 * The admin token(s): every non-empty line of `token_file` when it is set
 * (two lines while a token is being rotated), else the variable `token_env`
 * names. Never from the configuration file itself, so that can be committed.
 */
export function loadAdminTokens(admin: AdminConfig, env: NodeJS.ProcessEnv = process.env): AdminTokens {
  let tokens: string[];
  let source: string;
  if (admin.token_file) {
    source = `file ${admin.token_file}`;
    let text: string;
    try {
      text = readFileSync(admin.token_file, "utf8");
    } catch (err) {
      throw new AdminAuthError(
        `admin.token_file: cannot read ${admin.token_file}: ${(err as Error).message}`,
      );
    }
    tokens = text
      .split("\n")
      .map((l) => l.trim())
      .filter((l) => l !== "" && !l.startsWith("#"));
    if (tokens.length === 0) throw new AdminAuthError(`admin.token_file: ${admin.token_file} holds no token`);
  } else {
    const v = env[admin.token_env]?.trim();
    if (!v) return { tokens: [], source: "none" };
    tokens = [v];
    source = `$${admin.token_env}`;
  }
  const short = tokens.find((t) => t.length < MIN_TOKEN_LENGTH);
  if (short !== undefined)
    throw new AdminAuthError(
      `the admin token from ${source} is shorter than ${MIN_TOKEN_LENGTH} characters: use a random one, e.g. \`openssl rand -hex 32\``,
    );
  return { tokens, source };
}

/** True when `addr` (HOST:PORT) binds only a loopback interface. */
export function isLoopbackListen(addr: string): boolean {
  const { host } = parseListen(addr);
  if (host === undefined) return false;
  if (host === "localhost") return true;
  if (isIPv4(host)) return host.startsWith("127.");
  return isIPv6(host) && (host === "::1" || /^::ffff:127\./i.test(host));
}

/** The remote address of an admin request, set per request by the server (contextValues). */
export const remoteAddressKey = createContextKey<string | undefined>(undefined, {
  description: "the admin client's address",
});

const digest = (s: string) => createHash("sha256").update(s).digest();

export type AdminVerdict =
  | { ok: true; by: "token" | "network" | "open" }
  | { ok: false; reason: "missing" | "wrong"; message: string };

export class AdminAuth {
  private digests: Buffer[] = [];
  private readonly trusted = new BlockList();
  private readonly hasTrusted: boolean;
  readonly failures: Record<"missing" | "wrong", number> = { missing: 0, wrong: 0 };
  /** Re-reads of the tokens on SIGHUP, by result: what an operator rotating one checks. */
  readonly reloads: Record<"loaded" | "refused", number> = { loaded: 0, refused: 0 };

  constructor(tokens: readonly string[], readOnlyNetworks: readonly string[]) {
    this.setTokens(tokens);
    for (const net of readOnlyNetworks) {
      const [address, prefix] = net.split("/") as [string, string];
      this.trusted.addSubnet(address, Number(prefix), isIPv4(address) ? "ipv4" : "ipv6");
    }
    this.hasTrusted = readOnlyNetworks.length > 0;
  }

  /** Replaces the accepted tokens (SIGHUP re-reads token_file). */
  setTokens(tokens: readonly string[]): void {
    this.digests = tokens.map(digest);
  }

  get enabled(): boolean {
    return this.digests.length > 0;
  }

  /** Whether a call of `method` with this Authorization header from `remote` may proceed. */
  check(method: DescMethod, authorization: string | null, remote: string | undefined): AdminVerdict {
    if (!this.enabled) return { ok: true, by: "open" };
    const presented = /^Bearer\s+(\S+)\s*$/i.exec(authorization ?? "")?.[1];
    if (presented !== undefined && this.matches(presented)) return { ok: true, by: "token" };
    if (opensToReadOnlyNetworks(method.localName) && this.fromTrusted(remote))
      return { ok: true, by: "network" };
    return presented === undefined
      ? {
          ok: false,
          reason: "missing",
          message:
            "this control plane requires an admin token: set $LLMGW_ADMIN_TOKEN or pass --token-file (docs/security.md)",
        }
      : { ok: false, reason: "wrong", message: "the admin token is not valid for this control plane" };
  }

  /** /metrics: a token, or a trusted network as access.ts says. */
  allowsRead(authorization: string | null, remote: string | undefined): boolean {
    if (!this.enabled) return true;
    const presented = /^Bearer\s+(\S+)\s*$/i.exec(authorization ?? "")?.[1];
    return (
      (presented !== undefined && this.matches(presented)) ||
      (opensToReadOnlyNetworks("/metrics") && this.fromTrusted(remote))
    );
  }

  /**
   * Refuses unauthenticated calls before any handler runs, so a refused call
   * changes nothing. `onRefused` logs (the caller throttles).
   */
  interceptor(onRefused: (v: AdminVerdict & { ok: false }, method: string, remote?: string) => void) {
    const interceptor: Interceptor = (next) => async (req) => {
      const remote = req.contextValues.get(remoteAddressKey);
      const v = this.check(req.method, req.header.get("authorization"), remote);
      if (!v.ok) {
        this.failures[v.reason]++;
        onRefused(v, req.method.name, remote);
        throw new ConnectError(v.message, Code.Unauthenticated);
      }
      return next(req);
    };
    return interceptor;
  }

  // Every configured token is compared, each in constant time over its
  // SHA-256, so neither the length nor the position of a match shows in the
  // time a call takes.
  private matches(presented: string): boolean {
    const d = digest(presented);
    let ok = false;
    for (const want of this.digests) ok = timingSafeEqual(d, want) || ok;
    return ok;
  }

  private fromTrusted(remote: string | undefined): boolean {
    if (!this.hasTrusted || !remote) return false;
    // A dual-stack listener reports IPv4 peers as ::ffff:a.b.c.d.
    const v4 = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(remote)?.[1];
    if (v4) return this.trusted.check(v4, "ipv4");
    return this.trusted.check(remote, isIPv4(remote) ? "ipv4" : "ipv6");
  }
}
