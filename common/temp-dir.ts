import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** A fresh directory under the system's temporary one, `llmgw-<prefix>-XXXXXX`. */
export function tempDir(prefix: string): string {
  return mkdtempSync(join(tmpdir(), `llmgw-${prefix}-`));
}
