import type { z } from "zod";

/**
 * Validation problems as operators and API users read them: each names the
 * path of the value to fix, `models[2].profiles[0].tensor_parallel: …`.
 * One formatter for the config file, EdgeSync and request bodies alike.
 */
export function formatPath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const p of path) {
    if (typeof p === "number") out += `[${p}]`;
    else out += out ? `.${String(p)}` : String(p);
  }
  return out;
}

export function formatIssues(error: z.ZodError): string[] {
  return error.issues.map((issue) => {
    const base = formatPath(issue.path);
    if (issue.code === "unrecognized_keys") {
      return issue.keys.map((k) => `${base ? `${base}.${k}` : k}: unknown key`).join("; ");
    }
    return `${base || "(root)"}: ${issue.message}`;
  });
}
