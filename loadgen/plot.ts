/**
 * Line plots as standalone SVG text: no dependencies, no scripts, no fonts
 * to fetch, so a figure opens in any browser and can be committed beside a
 * benchmark's table. Pure: the caller writes the string where it wants.
 *
 * A figure is one or more panels side by side sharing one legend (the same
 * series, e.g. one per routing policy, appear in every panel). Axes start
 * at zero when the data is non-negative and end at a round number; ticks
 * are 1-2-5 steps. A null y leaves a gap in its line.
 */
import type { LevelSummary, Load } from "./stats.ts";

export interface Point {
  x: number;
  y: number | null;
}

export interface Series {
  name: string;
  points: Point[];
}

export interface Panel {
  title: string;
  xLabel: string;
  yLabel: string;
  series: Series[];
}

export interface FigureOptions {
  title?: string;
  panelWidth?: number;
  panelHeight?: number;
}

/** Okabe-Ito: distinguishable with the common colour-vision deficiencies. */
const COLORS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442"];
const DASHES = ["", "6 3", "2 3", "8 3 2 3"];

const MARGIN = { left: 64, right: 20, top: 30, bottom: 46 };
const LEGEND_ROW = 20;
const TITLE_LINE = 20;
/** A generous average glyph width of the 14 px bold title, for wrapping without measuring text. */
const TITLE_CHAR_WIDTH = 8.5;

export function escapeXml(text: string): string {
  return text.replace(
    /[&<>"']/g,
    (c) => `&${{ "&": "amp", "<": "lt", ">": "gt", '"': "quot", "'": "apos" }[c]};`,
  );
}

/** A round step near range/target: 1, 2 or 5 × 10^k. */
export function niceStep(range: number, target = 5): number {
  const raw = range / target;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

interface Axis {
  lo: number;
  hi: number;
  ticks: number[];
  decimals: number;
}

function axis(values: number[]): Axis {
  let lo = Math.min(0, ...values);
  let hi = Math.max(...values);
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) [lo, hi] = [0, 1];
  if (hi <= lo) hi = lo + (Math.abs(lo) || 1);
  const step = niceStep(hi - lo);
  lo = Math.floor(lo / step) * step;
  hi = Math.ceil(hi / step) * step;
  const ticks: number[] = [];
  for (let v = lo; v <= hi + step / 2; v += step) ticks.push(v);
  return { lo, hi, ticks, decimals: Math.max(0, -Math.floor(Math.log10(step))) };
}

function tickLabel(v: number, a: Axis): string {
  if (Math.abs(a.hi) >= 10_000 && a.decimals === 0 && v !== 0) return `${Number((v / 1000).toFixed(1))}k`;
  return v.toFixed(a.decimals);
}

const f1 = (v: number) => Number(v.toFixed(1)).toString();

function panelSvg(p: Panel, x0: number, y0: number, w: number, h: number): string {
  const xs = p.series.flatMap((s) => s.points.map((pt) => pt.x));
  const ys = p.series.flatMap((s) => s.points.flatMap((pt) => (pt.y === null ? [] : [pt.y])));
  const ax = axis(xs);
  const ay = axis(ys);
  const left = x0 + MARGIN.left;
  const right = x0 + w - MARGIN.right;
  const top = y0 + MARGIN.top;
  const bottom = y0 + h - MARGIN.bottom;
  const sx = (v: number) => left + ((v - ax.lo) / (ax.hi - ax.lo)) * (right - left);
  const sy = (v: number) => bottom - ((v - ay.lo) / (ay.hi - ay.lo)) * (bottom - top);
  const out: string[] = [];
  out.push(
    `<text x="${f1((left + right) / 2)}" y="${f1(y0 + 18)}" text-anchor="middle" font-weight="bold">${escapeXml(p.title)}</text>`,
  );
  for (const t of ay.ticks) {
    const y = f1(sy(t));
    out.push(`<line x1="${f1(left)}" y1="${y}" x2="${f1(right)}" y2="${y}" stroke="#e5e5e5"/>`);
    out.push(
      `<text x="${f1(left - 6)}" y="${y}" text-anchor="end" dominant-baseline="middle">${tickLabel(t, ay)}</text>`,
    );
  }
  for (const t of ax.ticks) {
    const x = f1(sx(t));
    out.push(`<line x1="${x}" y1="${f1(bottom)}" x2="${x}" y2="${f1(bottom + 4)}" stroke="#333"/>`);
    out.push(`<text x="${x}" y="${f1(bottom + 16)}" text-anchor="middle">${tickLabel(t, ax)}</text>`);
  }
  out.push(
    `<path d="M${f1(left)} ${f1(top)}V${f1(bottom)}H${f1(right)}" fill="none" stroke="#333"/>`,
    `<text x="${f1((left + right) / 2)}" y="${f1(y0 + h - 8)}" text-anchor="middle">${escapeXml(p.xLabel)}</text>`,
    `<text transform="translate(${f1(x0 + 16)} ${f1((top + bottom) / 2)}) rotate(-90)" text-anchor="middle">${escapeXml(p.yLabel)}</text>`,
  );
  p.series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length]!;
    const dash = DASHES[Math.floor(i / COLORS.length) % DASHES.length]!;
    let d = "";
    let pen = "M";
    const dots: string[] = [];
    for (const pt of [...s.points].sort((a, b) => a.x - b.x)) {
      if (pt.y === null) {
        pen = "M";
        continue;
      }
      const x = f1(sx(pt.x));
      const y = f1(sy(pt.y));
      d += `${pen}${x} ${y}`;
      pen = "L";
      dots.push(`<circle cx="${x}" cy="${y}" r="3"/>`);
    }
    out.push(
      `<g class="series" data-name="${escapeXml(s.name)}" stroke="${color}" fill="${color}">` +
        `<title>${escapeXml(s.name)}</title>` +
        (d
          ? `<path d="${d}" fill="none" stroke-width="2"${dash ? ` stroke-dasharray="${dash}"` : ""}/>`
          : "") +
        dots.join("") +
        "</g>",
    );
  });
  return out.join("\n");
}

/** Legend entries laid out left to right, wrapping at `width`; returns the SVG and its height. */
function legend(names: string[], width: number, y0: number): { svg: string; height: number } {
  const out: string[] = [];
  let x = MARGIN.left;
  let row = 0;
  names.forEach((name, i) => {
    const itemWidth = 34 + name.length * 7;
    if (x + itemWidth > width && x > MARGIN.left) {
      x = MARGIN.left;
      row++;
    }
    const y = y0 + row * LEGEND_ROW + 10;
    const color = COLORS[i % COLORS.length]!;
    const dash = DASHES[Math.floor(i / COLORS.length) % DASHES.length]!;
    out.push(
      `<line x1="${x}" y1="${y}" x2="${x + 24}" y2="${y}" stroke="${color}" stroke-width="2"${dash ? ` stroke-dasharray="${dash}"` : ""}/>`,
      `<text x="${x + 30}" y="${y}" dominant-baseline="middle">${escapeXml(name)}</text>`,
    );
    x += itemWidth + 12;
  });
  return { svg: out.join("\n"), height: names.length === 0 ? 0 : (row + 1) * LEGEND_ROW + 6 };
}

/** Lines of at most `max` characters, broken at spaces (a longer word gets a line of its own); "\n" breaks too. */
export function wrap(text: string, max: number): string[] {
  const lines: string[] = [];
  for (const para of text.split("\n")) {
    let line = "";
    for (const word of para.split(" ").filter((w) => w !== "")) {
      if (line && line.length + 1 + word.length > max) {
        lines.push(line);
        line = word;
      } else line = line ? `${line} ${word}` : word;
    }
    if (line) lines.push(line);
  }
  return lines;
}

/** Panels side by side, one legend of every series name above them. */
export function svgFigure(panels: readonly Panel[], opts: FigureOptions = {}): string {
  const pw = opts.panelWidth ?? 520;
  const ph = opts.panelHeight ?? 340;
  const width = pw * Math.max(1, panels.length);
  const names = [...new Set(panels.flatMap((p) => p.series.map((s) => s.name)))];
  // One colour per name across panels: reorder each panel's series to the legend's order.
  const ordered = panels.map((p) => ({
    ...p,
    series: names.map((n) => p.series.find((s) => s.name === n) ?? { name: n, points: [] }),
  }));
  let y = 0;
  const parts: string[] = [];
  for (const line of wrap(opts.title ?? "", Math.floor(width / TITLE_CHAR_WIDTH))) {
    parts.push(
      `<text x="${width / 2}" y="${y + 20}" text-anchor="middle" font-size="14" font-weight="bold">${escapeXml(line)}</text>`,
    );
    y += TITLE_LINE;
  }
  if (y > 0) y += 6;
  const lg = legend(names, width, y);
  parts.push(lg.svg);
  y += lg.height;
  ordered.forEach((p, i) => {
    parts.push(panelSvg(p, i * pw, y, pw, ph));
  });
  const height = y + ph;
  // The accessible name: the figure's title, else its panels'.
  const name = (opts.title ?? panels.map((p) => p.title).join(", ")).replace(/\n/g, " ");
  return (
    `<?xml version="1.0" encoding="UTF-8"?>\n` +
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="12">\n` +
    `<title>${escapeXml(name || "plot")}</title>\n` +
    `<rect width="100%" height="100%" fill="#fff"/>\n${parts.join("\n")}\n</svg>\n`
  );
}

export function linePlot(panel: Panel, opts: FigureOptions = {}): string {
  return svgFigure([panel], opts);
}

export interface LoadRun {
  /** The series name: a routing policy, a target, a configuration. */
  name: string;
  levels: readonly LevelSummary[];
}

function loadAxisLabel(loads: Load[]): string {
  const kinds = new Set(loads.map((l) => l.kind));
  if (kinds.size !== 1) return "offered load";
  return kinds.has("rate") ? "offered rate (req/s)" : "concurrency (streams)";
}

/**
 * The two panels a load sweep is judged by: TTFT p90 against offered load
 * (where the knee shows) and output throughput against offered load (what
 * the knee buys), one line per run.
 */
export function loadFigure(runs: readonly LoadRun[], opts: FigureOptions = {}): string {
  const xLabel = loadAxisLabel(runs.flatMap((r) => r.levels.map((l) => l.load)));
  const series = (y: (l: LevelSummary) => number | null): Series[] =>
    runs.map((r) => ({ name: r.name, points: r.levels.map((l) => ({ x: l.load.value, y: y(l) })) }));
  return svgFigure(
    [
      {
        title: "TTFT p90",
        xLabel,
        yLabel: "TTFT p90 (ms)",
        series: series((l) => (l.ttft.p90 === null ? null : l.ttft.p90 * 1000)),
      },
      {
        title: "Output throughput",
        xLabel,
        yLabel: "output tokens/s",
        series: series((l) => l.outputTokensPerSecond),
      },
    ],
    opts,
  );
}
