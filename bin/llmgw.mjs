#!/usr/bin/env node
// The published entry point. Sources are TypeScript run through tsx's loader,
// so there is no build step between a checkout and a running fleet.
import { register } from "tsx/esm/api";

register();
await import("../cli/llmgw.ts");
