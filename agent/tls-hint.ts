const CERT_UNTRUSTED = new Set([
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "UNABLE_TO_GET_ISSUER_CERT",
  "CERT_SIGNATURE_FAILURE",
]);

/**
 * What an operator should do about a TLS verification failure against the
 * control plane, or undefined when `err` is not one. Retrying never fixes
 * these, so they deserve more than "stream failed".
 */
export function tlsHint(err: unknown, url: string): string | undefined {
  const codes = new Set<string>();
  for (let e: unknown = err, i = 0; e && i < 5; e = (e as { cause?: unknown }).cause, i++) {
    const c = (e as { code?: unknown }).code;
    if (typeof c === "string") codes.add(c);
  }
  const code = [...codes].find(
    (c) => c === "ERR_TLS_CERT_ALTNAME_INVALID" || c === "CERT_HAS_EXPIRED" || CERT_UNTRUSTED.has(c),
  );
  const msg = String((err as Error)?.message ?? err);
  if (code === "ERR_TLS_CERT_ALTNAME_INVALID" || /does not match certificate's altnames/.test(msg)) {
    const host = new URL(url).hostname;
    return `the control plane's certificate does not name ${host}: add it to agent_tls.hostnames on the control plane (the certificate is issued again at its next start), or use a --control-plane name it has`;
  }
  if (code === "CERT_HAS_EXPIRED")
    return "the control plane's certificate has expired: restart the control plane to issue it again";
  if ((code && CERT_UNTRUSTED.has(code)) || /self[- ]signed certificate|unable to verify/i.test(msg)) {
    return "the control plane's certificate does not chain to the CA this agent trusts (ca.crt in the state dir): if the control plane's CA was replaced, remove agent.crt and ca.crt and enroll again with a new --join-token";
  }
  return undefined;
}
