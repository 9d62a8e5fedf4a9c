/**
 * A join token as operators pass it around: `<secret>.<sha256-hex of the CA
 * certificate's DER>`, kubeadm-style. The secret authorizes one enrollment
 * (or N); the fingerprint lets a new agent pin the control plane's CA without
 * a file copied by hand.
 */
export interface JoinToken {
  secret: string;
  fingerprint: string;
}

const SECRET = /^[A-Za-z0-9_-]{16,128}$/;
const FINGERPRINT = /^[0-9a-f]{64}$/;

export function formatJoinToken(t: JoinToken): string {
  return `${t.secret}.${t.fingerprint}`;
}

/** Throws with a message fit for an operator when `text` is not a join token. */
export function parseJoinToken(text: string): JoinToken {
  const s = text.trim();
  const dot = s.lastIndexOf(".");
  const secret = dot < 0 ? s : s.slice(0, dot);
  const fingerprint = dot < 0 ? "" : s.slice(dot + 1).toLowerCase();
  if (!SECRET.test(secret) || !FINGERPRINT.test(fingerprint)) {
    throw new Error(
      "malformed join token: expected <secret>.<64 hex digits of the CA fingerprint>, as `llmgw ctl tokens create` prints it",
    );
  }
  return { secret, fingerprint };
}
