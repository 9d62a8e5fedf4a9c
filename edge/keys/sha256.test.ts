import { describe, expect, it } from "vitest";
import { sha256Hex } from "./sha256.ts";

const webCrypto = async (text: string) =>
  [...new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text)))]
    .map((b) => b.toString(16).padStart(2, "0"))
    .join("");

describe("sha256Hex", () => {
  it("matches Web Crypto on FIPS vectors, multi-byte text and every length across the block edges", async () => {
    const texts = ["", "abc", "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", "é€𝄞".repeat(30)];
    for (let n = 0; n < 200; n++) texts.push("k".repeat(n));
    for (const t of texts) expect(sha256Hex(t), `${t.length} chars`).toBe(await webCrypto(t));
    expect(sha256Hex("abc")).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  });
});
