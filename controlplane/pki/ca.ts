/**
 * The control plane is its own certificate authority for the agent stream
 * (docs/architecture.md, the control path): one ECDSA P-256 CA under
 * `data_dir/pki/`, a server certificate for the agent listener, and client
 * certificates for enrolled agents whose subject CN is the node name.
 */
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { isIP } from "node:net";
import { join } from "node:path";
import { writeFileAtomic } from "../../common/atomic-write.ts";
import {
  certFingerprint,
  EC_ALG,
  generateKeyPair,
  keyPairFromPem,
  privateKeyToPem,
  x509,
} from "../../common/x509.ts";

type Cert = InstanceType<typeof x509.X509Certificate>;

export interface Ca {
  cert: Cert;
  certPem: string;
  /** SHA-256 of the CA certificate's DER, lower-case hex. */
  fingerprint: string;
  keys: CryptoKeyPair;
}

const DAY = 86_400_000;
export const CA_VALIDITY_MS = 10 * 365 * DAY;
export const SERVER_VALIDITY_MS = 365 * DAY;
/** A server certificate with less than this left is issued again. */
export const SERVER_RENEW_BEFORE_MS = 30 * DAY;
/** Clocks differ: certificates are valid from a little before they are made. */
const BACKDATE_MS = 5 * 60_000;

function serial(): string {
  const b = randomBytes(16);
  b[0]! &= 0x7f; // positive
  b[0]! |= 0x01; // and no leading zero byte to strip
  return b.toString("hex");
}

/** What a stored CA file holds, or an error naming the file and the way out. */
async function readCaFile<T>(path: string, what: string, parse: (pem: string) => T | Promise<T>): Promise<T> {
  try {
    return await parse(readFileSync(path, "utf8"));
  } catch (err) {
    throw new Error(
      `${path} is not a usable ${what} (${(err as Error).message}): restore it from a backup, or remove both ca.key and ca.crt to create a new CA (every agent must then enroll again)`,
    );
  }
}

export async function loadOrCreateCa(
  dir: string,
  now: () => number = Date.now,
): Promise<{ ca: Ca; created: boolean }> {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const keyPath = join(dir, "ca.key");
  const certPath = join(dir, "ca.crt");
  const hasKey = existsSync(keyPath);
  const hasCert = existsSync(certPath);
  if (hasKey !== hasCert) {
    // Making a new CA here would silently orphan every enrolled agent.
    throw new Error(
      `${hasKey ? certPath : keyPath} is missing but ${hasKey ? keyPath : certPath} exists: restore it, or remove both to create a new CA (every agent must then enroll again)`,
    );
  }
  if (hasKey) {
    const keys = await readCaFile(keyPath, "key", keyPairFromPem);
    const cert = await readCaFile(certPath, "certificate", (pem) => new x509.X509Certificate(pem));
    return {
      ca: { cert, certPem: cert.toString("pem"), fingerprint: certFingerprint(cert), keys },
      created: false,
    };
  }
  const keys = await generateKeyPair();
  const t = now();
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: serial(),
    name: [{ CN: ["llmgw agent CA"] }, { O: ["llmgw"] }],
    notBefore: new Date(t - BACKDATE_MS),
    notAfter: new Date(t + CA_VALIDITY_MS),
    keys,
    signingAlgorithm: EC_ALG,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  const certPem = cert.toString("pem");
  writeFileAtomic(keyPath, await privateKeyToPem(keys.privateKey), 0o600);
  writeFileAtomic(certPath, `${certPem}\n`);
  return { ca: { cert, certPem, fingerprint: certFingerprint(cert), keys }, created: true };
}

export function sanNames(hostnames: readonly string[]): { type: "dns" | "ip"; value: string }[] {
  return [...new Set(hostnames)].map((h) => ({ type: isIP(h) ? "ip" : "dns", value: h }));
}

function certSans(cert: Cert): string[] {
  const ext = cert.getExtension(x509.SubjectAlternativeNameExtension);
  if (!ext) return [];
  return ext.names.toJSON().map((n) => `${n.type}:${n.value}`);
}

export interface ServerCert {
  keyPem: string;
  certPem: string;
  notAfter: Date;
  /** Why it was issued now; undefined when the stored one was reused. */
  issued?: string;
}

/**
 * The agent listener's certificate: reused while it is signed by `ca`, names
 * exactly `hostnames`, and has more than SERVER_RENEW_BEFORE_MS left;
 * otherwise issued again (same files).
 */
export async function ensureServerCert(
  ca: Ca,
  dir: string,
  hostnames: readonly string[],
  now: () => number = Date.now,
): Promise<ServerCert> {
  const keyPath = join(dir, "server.key");
  const certPath = join(dir, "server.crt");
  const want = sanNames(hostnames)
    .map((n) => `${n.type}:${n.value}`)
    .sort();
  let why = "none stored";
  if (existsSync(keyPath) && existsSync(certPath)) {
    const certPem = readFileSync(certPath, "utf8");
    const cert = new x509.X509Certificate(certPem);
    const have = certSans(cert).sort();
    if (!(await cert.verify({ publicKey: ca.keys.publicKey, signatureOnly: true })))
      why = "not signed by the current CA";
    else if (have.join(",") !== want.join(",")) why = `names changed (${have.join(" ")} → ${want.join(" ")})`;
    else if (cert.notAfter.getTime() - now() < SERVER_RENEW_BEFORE_MS) why = "near expiry";
    else return { keyPem: readFileSync(keyPath, "utf8"), certPem, notAfter: cert.notAfter };
  }
  const keys = await generateKeyPair();
  const t = now();
  const cert = await issueLeaf(ca, {
    subject: [{ CN: [hostnames[0] ?? "llmgw control plane"] }, { O: ["llmgw"] }],
    publicKey: keys.publicKey,
    notAfter: t + SERVER_VALIDITY_MS,
    usage: x509.ExtendedKeyUsage.serverAuth,
    at: t,
    more: [new x509.SubjectAlternativeNameExtension(sanNames(hostnames))],
  });
  const keyPem = await privateKeyToPem(keys.privateKey);
  const certPem = `${cert.toString("pem")}\n`;
  writeFileAtomic(keyPath, keyPem, 0o600);
  writeFileAtomic(certPath, certPem);
  return { keyPem, certPem, notAfter: cert.notAfter, issued: why };
}

export class CsrError extends Error {}

/**
 * Signs an agent's CSR: the CSR must be well-formed, self-signed by its key,
 * and name exactly `nodeName` as its CN. The certificate is for client
 * authentication only.
 */
export async function signClientCsr(
  ca: Ca,
  csrPem: string,
  nodeName: string,
  validityMs: number,
  now: () => number = Date.now,
): Promise<string> {
  if (csrPem.length > 16_384) throw new CsrError("the CSR is larger than 16 KiB");
  let csr: InstanceType<typeof x509.Pkcs10CertificateRequest>;
  try {
    csr = new x509.Pkcs10CertificateRequest(csrPem);
  } catch (err) {
    throw new CsrError(`the CSR cannot be parsed: ${(err as Error).message}`);
  }
  if (!(await csr.verify().catch(() => false)))
    throw new CsrError("the CSR's signature does not verify against its own key");
  const cns = csr.subjectName.getField("CN");
  if (cns.length !== 1 || cns[0] !== nodeName) {
    throw new CsrError(
      `the CSR's subject CN (${cns.length ? cns.map((c) => `"${c}"`).join(", ") : "none"}) must equal the node name "${nodeName}"`,
    );
  }
  const t = now();
  const cert = await issueLeaf(ca, {
    subject: [{ CN: [nodeName] }],
    publicKey: csr.publicKey,
    notAfter: Math.min(t + validityMs, ca.cert.notAfter.getTime()),
    usage: x509.ExtendedKeyUsage.clientAuth,
    at: t,
  });
  return `${cert.toString("pem")}\n`;
}

/** An end-entity certificate signed by the CA: server or client authentication, never a CA itself. */
async function issueLeaf(
  ca: Ca,
  l: {
    subject: x509.JsonName;
    publicKey: CryptoKey | InstanceType<typeof x509.PublicKey>;
    notAfter: number;
    usage: x509.ExtendedKeyUsageType;
    at: number;
    more?: x509.Extension[];
  },
): Promise<InstanceType<typeof x509.X509Certificate>> {
  return x509.X509CertificateGenerator.create({
    serialNumber: serial(),
    subject: l.subject,
    issuer: ca.cert.subjectName,
    notBefore: new Date(l.at - BACKDATE_MS),
    notAfter: new Date(l.notAfter),
    publicKey: l.publicKey,
    signingKey: ca.keys.privateKey,
    signingAlgorithm: EC_ALG,
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
      new x509.ExtendedKeyUsageExtension([l.usage]),
      ...(l.more ?? []),
      await x509.SubjectKeyIdentifierExtension.create(l.publicKey),
      await x509.AuthorityKeyIdentifierExtension.create(ca.keys.publicKey),
    ],
  });
}
