/**
 * `npm run check:start [-- --runs N --cycles N]`: the README's first five
 * minutes, repeated. `--runs` fresh starts (default 10), each on a new state
 * directory; then `--cycles` start / Ctrl-C cycles on one state directory
 * (default 3). Each start is `npm start` in a process group of its own, the
 * README's curl fired the moment the banner prints, then SIGINT to the whole
 * group as a terminal sends it. Prints per start: time to the banner, the
 * curl's status and first token, crashes counted, time from Ctrl-C to exit,
 * processes left behind; exits 1 when any start fails a check.
 * test/stack/npm-start.test.ts runs two cycles of the same in `npm test`.
 */
import { rmSync } from "node:fs";
import { parseArgs } from "node:util";
import { tempDir } from "../common/temp-dir.ts";
import {
  crashesCounted,
  runCurl,
  type StackRun,
  stackPorts,
  stackProcesses,
  startStack,
} from "./stack-run.ts";

const { values } = parseArgs({
  options: { runs: { type: "string", default: "10" }, cycles: { type: "string", default: "3" } },
});
const runs = Number(values.runs);
const cycles = Number(values.cycles);
if (!Number.isInteger(runs) || runs < 0 || !Number.isInteger(cycles) || cycles < 0) {
  process.stderr.write("check:start: --runs and --cycles take whole numbers\n");
  process.exit(2);
}

interface Row {
  label: string;
  bannerS?: number;
  status?: number;
  firstTokenMs?: number;
  crashes: string[];
  stopS?: number;
  exitCode?: number | null;
  left: string[];
  error?: string;
}

const ok = (r: Row) =>
  !r.error && r.status === 200 && r.crashes.length === 0 && r.exitCode === 0 && r.left.length === 0;

// Each stack leads a process group of its own, out of reach of this
// terminal's Ctrl-C: take the one running down on the way out.
let current: StackRun | undefined;
process.on("SIGINT", () => {
  current?.destroy();
  process.exit(130);
});

async function once(label: string, stateDir: string): Promise<Row> {
  const run = startStack(stateDir, await stackPorts());
  current = run;
  const row: Row = { label, crashes: [], left: [] };
  try {
    const banner = await run.banner;
    const curl = await runCurl(banner.curl);
    row.bannerS = banner.ms / 1000;
    row.status = curl.status;
    row.firstTokenMs = curl.firstTokenMs;
    row.crashes = await crashesCounted(run);
    const stopped = await run.interrupt();
    row.stopS = stopped.ms / 1000;
    row.exitCode = stopped.code;
    row.left = stackProcesses(run.mark).map((p) => `${p.pid} ${p.argv.slice(0, 4).join(" ")}`);
  } catch (err) {
    row.error = (err as Error).message.split("\n")[0];
  } finally {
    run.destroy();
  }
  return row;
}

const COLUMNS = [
  "start",
  "banner s",
  "curl",
  "1st token ms",
  "crashes",
  "Ctrl-C→exit s",
  "exit",
  "left behind",
];
const WIDTHS = [10, 9, 5, 13, 8, 14, 5, 11];
const line = (cells: string[]) => `${cells.map((c, i) => c.padEnd(WIDTHS[i]!)).join(" ")}\n`;

function print(r: Row): void {
  process.stdout.write(
    line([
      r.label,
      r.bannerS?.toFixed(1) ?? "-",
      String(r.status ?? "-"),
      String(r.firstTokenMs ?? "-"),
      String(r.crashes.length),
      r.stopS?.toFixed(2) ?? "-",
      String(r.exitCode ?? "-"),
      String(r.left.length),
    ]),
  );
  for (const detail of [...r.crashes, ...r.left, ...(r.error ? [r.error] : [])])
    process.stdout.write(`    ${detail}\n`);
}

const rows: Row[] = [];
process.stdout.write(line(COLUMNS));
for (let i = 1; i <= runs; i++) {
  const dir = tempDir("check-start");
  const row = await once(`fresh ${i}`, dir);
  rmSync(dir, { recursive: true, force: true });
  print(row);
  rows.push(row);
}
const cycleDir = tempDir("check-start-cycles");
const cycleRows: Row[] = [];
for (let i = 1; i <= cycles; i++) {
  const row = await once(`cycle ${i}`, cycleDir);
  print(row);
  cycleRows.push(row);
}
rmSync(cycleDir, { recursive: true, force: true });

const all = [...rows, ...cycleRows];
const passed = all.filter(ok).length;
process.stdout.write(`\n${passed} of ${all.length} starts passed every check`);
if (runs > 0)
  process.stdout.write(
    `; README curl at the banner: ${rows.filter((r) => r.status === 200).length} of ${runs} fresh starts HTTP 200`,
  );
const first = cycleRows[0]?.bannerS;
const last = cycleRows.at(-1)?.bannerS;
if (cycles > 1 && first && last)
  process.stdout.write(`; cycle ${cycles} start / cycle 1 start: ${(last / first).toFixed(2)}`);
process.stdout.write("\n");
process.exitCode = passed === all.length ? 0 : 1;
