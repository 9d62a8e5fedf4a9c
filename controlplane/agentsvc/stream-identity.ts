/**
 * Whether an agent stream's client certificate may speak for the node it
 * registers (docs/security.md): a rogue or broken agent can only speak for
 * its own node. Checked only on the mTLS listener.
 */
import type { CertFacts } from "../certificates.ts";
import type { ClaimRefusals } from "./claim-refusals.ts";

/** The certificate record the check reads, and binds a node's first certificate in. */
export interface StreamCertificates {
  isRevoked(serial: string): boolean;
  /**
   * Records the certificate a stream was opened with; returns the serial
   * on record for its node when that is another one (certificates.ts).
   */
  claim(cert: CertFacts, now: number): string | undefined;
}

/** Why a stream is refused: the code and message it is sent, and the log line. */
export interface StreamRefusal {
  code: string;
  message: string;
  log: string;
  fields: Record<string, unknown>;
}

/**
 * The refusal for a stream whose certificate is missing, revoked, for
 * another node, or not the one the node is bound to; undefined when it may
 * register `claimed`. A certificate refused for a bound node is noted in
 * `claims` for `ctl nodes`.
 */
export function streamIdentityRefusal(
  certs: StreamCertificates,
  claims: ClaimRefusals | undefined,
  claimed: string,
  identity: CertFacts | undefined,
  from: string,
  now: number,
): StreamRefusal | undefined {
  if (!identity)
    return {
      code: "unauthenticated",
      message:
        "this control plane requires an agent client certificate signed by its CA: enroll with --join-token",
      log: "agent refused: no authorized client certificate",
      fields: { node: claimed },
    };
  if (certs.isRevoked(identity.serial))
    return {
      code: "revoked",
      message: `the certificate of node "${identity.node}" (serial ${identity.serial}) was revoked: re-admitting it takes a new join token`,
      log: "agent refused: its certificate is revoked",
      fields: { node: claimed, serial: identity.serial },
    };
  if (identity.node !== claimed)
    return {
      code: "wrong_identity",
      message: `the client certificate is for node "${identity.node}", but the agent registers as "${claimed}"`,
      log: "agent refused: certificate is for another node",
      fields: { node: claimed, certificate: identity.node },
    };
  const bound = certs.claim(identity, now);
  if (bound === undefined) return undefined;
  claims?.note(claimed, { at: now, reason: "wrong_certificate", from, serial: identity.serial });
  return {
    code: "wrong_certificate",
    message: `node "${claimed}" is bound to another certificate (serial ${bound}): this one (serial ${identity.serial}) cannot speak for it`,
    log: "agent refused: node is bound to another certificate",
    fields: { node: claimed, serial: identity.serial, boundSerial: bound, from },
  };
}
