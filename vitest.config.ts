import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["**/*.test.ts"],
    exclude: ["node_modules/**", ".wrangler/**"],
    // Integration tests start real processes; the machine has two cores.
    maxWorkers: 2,
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: "forks",
    globalSetup: ["./test/harness/global-setup.ts"],
    reporters: ["default", "./test/harness/summary-reporter.ts"],
  },
});
