import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { tempDir } from "../common/temp-dir.ts";
import { CertificateStore } from "./certificates.ts";

const cert = (serial: string, node = "gpu-1") => ({ serial, node, notBefore: 0, notAfter: 10_000_000 });

describe("CertificateStore: which certificate holds a node's stream", () => {
  it("binds the enrolled certificate and refuses any other for the name", () => {
    const certs = new CertificateStore(join(tempDir("certs"), "llmgw.db"));
    certs.bind(cert("0a"), 1);
    expect(certs.claim(cert("0a"), 2)).toBeUndefined();
    expect(certs.claim(cert("0b"), 3)).toBe("a");
  });

  it("keeps the old certificate until the renewed one is first used, then only the renewed one", () => {
    const certs = new CertificateStore(join(tempDir("certs"), "llmgw.db"));
    certs.bind(cert("0a"), 1);
    certs.renewed(cert("0c"));
    // The agent never got the answer: the old certificate still holds.
    expect(certs.claim(cert("0a"), 2)).toBeUndefined();
    // It did, and uses it: from now on only it.
    expect(certs.claim(cert("0c"), 3)).toBeUndefined();
    expect(certs.claim(cert("0a"), 4)).toBe("c");
    expect(certs.boundSerial("gpu-1")).toBe("c");
  });

  it("an enrollment clears a renewal not yet used", () => {
    const certs = new CertificateStore(join(tempDir("certs"), "llmgw.db"));
    certs.bind(cert("0a"), 1);
    certs.renewed(cert("0c"));
    certs.bind(cert("0d"), 2);
    expect(certs.claim(cert("0c"), 3)).toBe("d");
  });
});
