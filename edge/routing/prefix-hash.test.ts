import { describe, expect, it } from "vitest";
import { BLOCK_CHARS, blockHashes, MAX_BLOCKS, promptText, requestPrefixHashes } from "./prefix-hash.ts";

describe("prefix hashes", () => {
  const text = "abcdefghij".repeat(40); // 400 characters: 6 whole blocks

  it("hashes whole 64-character blocks only, chained: equal up to block i means equal hash i", () => {
    const h = blockHashes(text, "m");
    expect(h).toHaveLength(Math.floor(400 / BLOCK_CHARS));
    const changedTail = blockHashes(`${text.slice(0, 200)}X${text.slice(201)}`, "m");
    // Character 200 is in block 3: blocks 0–2 agree, 3 on differ.
    expect(changedTail.slice(0, 3)).toEqual(h.slice(0, 3));
    for (let i = 3; i < h.length; i++) expect(changedTail[i]).not.toBe(h[i]);
    for (const v of h) expect(Number.isSafeInteger(v)).toBe(true);
  });

  it("a different seed (model, cache_salt) shares nothing", () => {
    const a = blockHashes(text, "m");
    const b = blockHashes(text, "other");
    expect(a.filter((v, i) => v === b[i])).toEqual([]);
  });

  it("stops at MAX_BLOCKS", () => {
    expect(blockHashes("x".repeat(BLOCK_CHARS * (MAX_BLOCKS + 10)), "m")).toHaveLength(MAX_BLOCKS);
  });

  it("reads chat messages (string or text parts) and completion prompts", () => {
    const chat = promptText({
      messages: [
        { role: "system", content: "You help." },
        { role: "user", content: [{ type: "text", text: "Hi" }, { type: "image_url" }] },
      ],
    });
    expect(chat).toBe("system\nYou help.\nuser\nHi\n");
    expect(promptText({ prompt: "Once upon" })).toBe("Once upon");
    expect(promptText({ prompt: ["first", "second"] })).toBe("first");
    expect(promptText({ prompt: [1, 2, 3] })).toBe("1,2,3");
    expect(promptText({ prompt: [[4, 5]] })).toBe("4,5");
    expect(promptText({})).toBe("");
  });

  it("requests with another cache_salt never match", () => {
    const body = { messages: [{ role: "user", content: text }] };
    const plain = requestPrefixHashes("m", body);
    expect(requestPrefixHashes("m", { ...body })).toEqual(plain);
    expect(requestPrefixHashes("m", { ...body, cache_salt: "tenant-a" })[0]).not.toBe(plain[0]);
  });
});
