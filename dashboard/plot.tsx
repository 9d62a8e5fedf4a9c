import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";
import type { Aligned } from "./edge-series.ts";

// Distinct enough side by side; models beyond eight reuse them.
const COLORS = ["#3b6fd8", "#d8663b", "#1a7f37", "#9b3bd8", "#c62828", "#0f8a8a", "#b35900", "#5d6879"];

/** What GetEdgeStatus keeps: 15 minutes of samples. */
const WINDOW_S = 15 * 60;

/** A uPlot line chart, one series per name; data replaced in place on each poll. */
export function Plot(props: {
  title: string;
  names: readonly string[];
  data: Aligned;
  yRange?: [number, number];
}) {
  const el = useRef<HTMLDivElement>(null);
  const chart = useRef<uPlot | null>(null);
  const key = props.names.join("\n");
  // A new chart only when the series change; each poll's data goes in through setData below.
  useEffect(() => {
    if (!el.current) return;
    const range = props.yRange;
    chart.current = new uPlot(
      {
        title: props.title,
        width: Math.max(300, el.current.clientWidth),
        height: 180,
        // The x axis is always the last 15 minutes, however few samples there are yet.
        scales: {
          x: { time: true, range: () => [Date.now() / 1000 - WINDOW_S, Date.now() / 1000] },
          y: range ? { range: () => range } : {},
        },
        series: [
          {},
          ...props.names.map((name, i) => ({ label: name, stroke: COLORS[i % COLORS.length]!, width: 2 })),
        ],
        legend: { live: false },
      },
      props.data,
      el.current,
    );
    return () => {
      chart.current?.destroy();
      chart.current = null;
    };
  }, [key]);
  useEffect(() => {
    chart.current?.setData(props.data);
  }, [props.data]);
  return <div class="plot" ref={el} />;
}
