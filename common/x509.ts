/**
 * @peculiar/x509 on Node's webcrypto. Import it from here, never directly:
 * the Reflect polyfill must be evaluated first and the crypto provider set.
 */
import "./reflect-polyfill.ts";
import { createHash, webcrypto } from "node:crypto";
import * as x509 from "@peculiar/x509";

x509.cryptoProvider.set(webcrypto as unknown as Crypto);

export { x509 };
export const subtle = webcrypto.subtle;

/** ECDSA P-256 with SHA-256 for every key and signature llmgw makes. */
export const EC_ALG = { name: "ECDSA", namedCurve: "P-256", hash: "SHA-256" } as const;

export async function generateKeyPair(): Promise<CryptoKeyPair> {
  return (await subtle.generateKey(EC_ALG, true, ["sign", "verify"])) as CryptoKeyPair;
}

export async function privateKeyToPem(key: CryptoKey): Promise<string> {
  const der = await subtle.exportKey("pkcs8", key);
  return x509.PemConverter.encode(der, "PRIVATE KEY");
}

/** Imports a PKCS#8 P-256 key and derives its public half. */
export async function keyPairFromPem(pem: string): Promise<CryptoKeyPair> {
  const der = x509.PemConverter.decodeFirst(pem);
  const privateKey = await subtle.importKey("pkcs8", der, EC_ALG, true, ["sign"]);
  const jwk = await subtle.exportKey("jwk", privateKey);
  delete jwk.d;
  jwk.key_ops = ["verify"];
  const publicKey = await subtle.importKey("jwk", jwk, EC_ALG, true, ["verify"]);
  return { privateKey, publicKey } as CryptoKeyPair;
}

/** SHA-256, lower-case hex: over a CA certificate's DER, it is what a join token pins. */
export function sha256Hex(bytes: Uint8Array | ArrayBuffer): string {
  return createHash("sha256")
    .update(bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes))
    .digest("hex");
}

export function certFingerprint(cert: InstanceType<typeof x509.X509Certificate>): string {
  return sha256Hex(cert.rawData);
}

/**
 * A P-256 key and a CSR with CN = the node name, as the agent sends it to
 * Enroll; for a renewal, a CSR for the key it already has.
 */
export async function createCsr(
  commonName: string,
  existingKeyPem?: string,
): Promise<{ keyPem: string; csrPem: string }> {
  const keys = existingKeyPem ? await keyPairFromPem(existingKeyPem) : await generateKeyPair();
  const csr = await x509.Pkcs10CertificateRequestGenerator.create({
    name: [{ CN: [commonName] }],
    keys,
    signingAlgorithm: EC_ALG,
  });
  return { keyPem: await privateKeyToPem(keys.privateKey), csrPem: csr.toString("pem") };
}
