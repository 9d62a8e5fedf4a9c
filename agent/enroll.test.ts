import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { createLogger } from "../common/log.ts";
import { EnrollError, loadOrEnroll, stateFiles } from "./enroll.ts";

describe("the agent's stored certificate", () => {
  it("that is no certificate is named, with the way out, before any connection", async () => {
    const dir = mkdtempSync(join(tmpdir(), "llmgw-enroll-"));
    const files = stateFiles(dir);
    for (const f of [files.key, files.ca]) writeFileSync(f, "whatever\n");
    writeFileSync(files.cert, "-----BEGIN CERTIFICATE-----\ntruncated\n");
    const enrolling = loadOrEnroll({
      url: "https://127.0.0.1:1",
      node: "n1",
      stateDir: dir,
      joinToken: undefined,
      caFile: undefined,
      log: createLogger({}, "error", () => {}),
    });
    await expect(enrolling).rejects.toBeInstanceOf(EnrollError);
    await expect(enrolling).rejects.toThrow(`${files.cert} is not a usable certificate`);
  });
});
