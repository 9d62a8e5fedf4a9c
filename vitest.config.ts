import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["**/*.test.ts"],
    exclude: ["node_modules/**", ".wrangler/**"],
    // Integration tests start real processes and spend most of their time
    // waiting on them (a 60 s rate window, certificate lifetimes, engine
    // steps): on two cores, a third worker fills that idle time (4m44s →
    // 3m45s here) without starving the tests that measure latency.
    maxWorkers: 3,
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: "forks",
    globalSetup: ["./test/harness/global-setup.ts"],
    reporters: ["default", "./test/harness/summary-reporter.ts"],
  },
});
