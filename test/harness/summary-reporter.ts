import type { SerializedError } from "vitest";
import type { Reporter, TestModule } from "vitest/node";

/**
 * Ends a run with one plain line, `N passed, N failed, N skipped`, that CI
 * systems and people can read without parsing vitest's own summary. A file
 * that failed outside any test (a failed beforeAll, an import error) counts
 * as one failure, so its skipped tests never hide it.
 */
export default class SummaryReporter implements Reporter {
  onTestRunEnd(modules: ReadonlyArray<TestModule>, errors: ReadonlyArray<SerializedError>): void {
    const count = { passed: 0, failed: 0, skipped: 0 };
    for (const m of modules) {
      let failedHere = 0;
      for (const t of m.children.allTests()) {
        const state = t.result().state;
        if (state === "passed") count.passed++;
        else if (state === "failed") failedHere++;
        else count.skipped++;
      }
      if (failedHere === 0 && m.state() === "failed") failedHere = 1;
      count.failed += failedHere;
    }
    count.failed += errors.length;
    process.stdout.write(`\n${count.passed} passed, ${count.failed} failed, ${count.skipped} skipped\n`);
  }
}
