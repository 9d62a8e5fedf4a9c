#!/usr/bin/env node
// The published entry point. In a checkout it runs the TypeScript sources
// through tsx's loader, so there is no build step between an edit and a
// running process. An installed package carries no sources and no tsx, only
// the JavaScript that `npm pack` compiled into dist/ (scripts/build.ts).
import { existsSync } from "node:fs";

// node:sqlite (the control plane's store) is unflagged from 22.13 on.
const [major, minor] = process.versions.node.split(".").map(Number);
if (major < 22 || (major === 22 && minor < 13)) {
  process.stderr.write(`llmgw: needs Node.js 22.13 or newer; ${process.execPath} is ${process.version}\n`);
  process.exit(1);
}

const source = new URL("../cli/llmgw.ts", import.meta.url);
if (existsSync(source)) {
  const { register } = await import("tsx/esm/api");
  register();
  await import(source.href);
} else {
  await import("../dist/cli/llmgw.js");
}
