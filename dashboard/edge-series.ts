import type { EdgeModel } from "../proto/gen/control/v1/control_pb.ts";

/**
 * The edge's 15-minute history as uPlot wants it: one x axis (Unix
 * seconds) shared by every model, one y series per model, null where a
 * model has no sample at that instant (or, for saturation, no routable
 * endpoint). Pure, so it is tested without a browser.
 */
export type Aligned = [number[], ...(number | null)[][]];

export type Figure = "saturation" | "queue" | "tokens";

function value(figure: Figure, s: EdgeModel["history"][number]): number | null {
  if (figure === "saturation") return s.saturation < 0 ? null : s.saturation;
  if (figure === "tokens") return s.generatedTokensPerSecond;
  return Object.values(s.queueDepth).reduce((a, b) => a + b, 0);
}

export function alignHistory(models: readonly EdgeModel[], figure: Figure): Aligned {
  const xs = [...new Set(models.flatMap((m) => m.history.map((s) => Number(s.atUnixMs))))].sort(
    (a, b) => a - b,
  );
  const col = new Map(xs.map((x, i) => [x, i]));
  const series = models.map((m) => {
    const ys: (number | null)[] = xs.map(() => null);
    for (const s of m.history) ys[col.get(Number(s.atUnixMs))!] = value(figure, s);
    return ys;
  });
  return [xs.map((x) => x / 1000), ...series];
}
