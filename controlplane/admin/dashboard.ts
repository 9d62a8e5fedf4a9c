/**
 * The dashboard's files, served at `/` on the admin listener. They hold no
 * data: the page reads everything through ControlService with the admin
 * token, so serving them needs no token. The bundle is built by
 * scripts/build-dashboard.ts into dashboard/build/ in a checkout and
 * dist/dashboard/build/ in a package: the same path from this module in both.
 */
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import type { ConnectNodeAdapterOptions } from "@connectrpc/connect-node";

export const DASHBOARD_DIR = join(import.meta.dirname, "..", "..", "dashboard", "build");

type Fallback = NonNullable<ConnectNodeAdapterOptions["fallback"]>;

const FILES: Record<string, { file: string; type: string }> = {
  "/": { file: "index.html", type: "text/html; charset=utf-8" },
  "/index.html": { file: "index.html", type: "text/html; charset=utf-8" },
  "/app.js": { file: "app.js", type: "text/javascript; charset=utf-8" },
  "/app.css": { file: "app.css", type: "text/css; charset=utf-8" },
};

// Everything the page loads comes from this origin; no frame may embed it
// (the actions are one click), and no address leaves through a Referer.
const HEADERS = {
  "content-security-policy":
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "cache-control": "no-cache",
};

/** Answers a dashboard file's request and returns true; false for any other path. */
export async function serveDashboard(
  req: Parameters<Fallback>[0],
  res: Parameters<Fallback>[1],
  dir = DASHBOARD_DIR,
): Promise<boolean> {
  const path = (req.url ?? "/").split("?")[0]!;
  const asset = FILES[path];
  if (!asset || (req.method !== "GET" && req.method !== "HEAD")) return false;
  let body: Buffer;
  try {
    body = await readFile(join(dir, asset.file));
  } catch {
    res.writeHead(503, { "content-type": "text/plain; charset=utf-8" });
    res.end(
      `the dashboard is not built here (${join(dir, asset.file)} is missing): run \`npm run build:dashboard\` in the checkout\n`,
    );
    return true;
  }
  res.writeHead(200, { ...HEADERS, "content-type": asset.type, "content-length": body.length });
  if (req.method === "HEAD") res.end();
  else res.end(body);
  return true;
}
