#!/usr/bin/env node
// A tiny stand-in engine for supervisor tests: takes vLLM's command line
// (`serve MODEL --host H --port P ...`), serves /health and /metrics, and
// misbehaves on request through FAKE_* environment variables:
//   FAKE_READY_AFTER_MS  listen only after this long (a model "loading")
//   FAKE_NEVER_READY=1   listen, but /health answers 503 forever
//   FAKE_IGNORE_SIGTERM=1  survive SIGTERM (only SIGKILL ends it)
//   FAKE_EXIT_AFTER_MS, FAKE_EXIT_CODE  crash on a timer
//   FAKE_LOAD_FILE       JSON {"running":N,"waiting":N} read on every /metrics
//   FAKE_CHILD=1         fork a worker (sleep) into the same process group
//   FAKE_UNHEALTHY_FILE  /health answers 503 while this file exists (a dead engine core)
import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { createServer } from "node:http";

const argv = process.argv.slice(2);
const flag = (name, fallback) => {
  const i = argv.indexOf(name);
  return i >= 0 && i + 1 < argv.length ? argv[i + 1] : fallback;
};
const host = flag("--host", "127.0.0.1");
const port = Number(flag("--port", "8000"));
const env = process.env;

console.log(`fake-engine pid ${process.pid} argv: ${argv.join(" ")}`);
console.log(`fake-engine env CUDA_VISIBLE_DEVICES=${env.CUDA_VISIBLE_DEVICES ?? ""}`);
for (let i = 0; i < 60; i++) console.log(`fake-engine loading line ${i}`);

if (env.FAKE_IGNORE_SIGTERM === "1") {
  process.on("SIGTERM", () => console.log("fake-engine ignoring SIGTERM"));
} else {
  process.on("SIGTERM", () => {
    console.log("fake-engine got SIGTERM, exiting");
    process.exit(0);
  });
}
if (env.FAKE_CHILD === "1") {
  const child = spawn("sleep", ["600"], { stdio: "ignore" });
  console.log(`fake-engine child pid ${child.pid}`);
}
if (env.FAKE_EXIT_AFTER_MS) {
  setTimeout(() => {
    console.error(`fake-engine crashing with code ${env.FAKE_EXIT_CODE ?? "1"}`);
    process.exit(Number(env.FAKE_EXIT_CODE ?? "1"));
  }, Number(env.FAKE_EXIT_AFTER_MS));
}

let counter = 0;
function load() {
  try {
    return JSON.parse(readFileSync(env.FAKE_LOAD_FILE, "utf8"));
  } catch {
    return { running: 0, waiting: 0 };
  }
}

const server = createServer((req, res) => {
  if (req.url === "/health") {
    const sick =
      env.FAKE_NEVER_READY === "1" || (env.FAKE_UNHEALTHY_FILE && existsSync(env.FAKE_UNHEALTHY_FILE));
    res.writeHead(sick ? 503 : 200).end();
    return;
  }
  if (req.url === "/metrics") {
    const l = load();
    counter += 10;
    res.writeHead(200, { "content-type": "text/plain; version=0.0.4" });
    res.end(
      [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        `vllm:num_requests_running{engine="0",model_name="m"} ${l.running ?? 0}`,
        "# TYPE vllm:num_requests_waiting gauge",
        `vllm:num_requests_waiting{engine="0",model_name="m"} ${l.waiting ?? 0}`,
        "# TYPE vllm:kv_cache_usage_perc gauge",
        `vllm:kv_cache_usage_perc{engine="0",model_name="m"} ${l.kv ?? 0.25}`,
        "# TYPE vllm:prefix_cache_queries counter",
        `vllm:prefix_cache_queries_total{engine="0",model_name="m"} ${counter}`,
        "# TYPE vllm:prefix_cache_hits counter",
        `vllm:prefix_cache_hits_total{engine="0",model_name="m"} ${counter / 2}`,
        "",
      ].join("\n"),
    );
    return;
  }
  res.writeHead(404).end();
});
setTimeout(() => server.listen(port, host), Number(env.FAKE_READY_AFTER_MS ?? "0"));
