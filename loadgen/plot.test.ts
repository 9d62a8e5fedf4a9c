import { describe, expect, it } from "vitest";
import { escapeXml, linePlot, loadFigure, niceStep, type Point, svgFigure, wrap } from "./plot.ts";
import { type LevelSummary, summarize } from "./stats.ts";

/**
 * Well-formedness as an XML parser sees it (no parser among the
 * dependencies): one root, tags nest and close, attribute values quoted,
 * no raw `<` or stray `&` in text or attributes. Returns the elements in
 * document order.
 */
function parseXml(doc: string): { name: string; attrs: Record<string, string>; text: string }[] {
  const body = doc.replace(/^<\?xml[^?]*\?>\s*/, "");
  const entity = /&(amp|lt|gt|quot|apos|#\d+);/g;
  const cleanText = (t: string, where: string) => {
    if (t.replace(entity, "").includes("&")) throw new Error(`stray & in ${where}: ${t}`);
  };
  const tag = /<(\/?)([A-Za-z][\w:-]*)((?:\s+[\w:-]+="[^"<]*")*)\s*(\/?)>/y;
  const stack: { name: string; at: number }[] = [];
  const out: { name: string; attrs: Record<string, string>; text: string }[] = [];
  let roots = 0;
  let i = 0;
  while (i < body.length) {
    const lt = body.indexOf("<", i);
    const text = body.slice(i, lt < 0 ? body.length : lt);
    if (stack.length === 0 && text.trim() !== "") throw new Error(`text outside the root: ${text}`);
    cleanText(text, "text");
    if (stack.length > 0) out[stack[stack.length - 1]!.at]!.text += text;
    if (lt < 0) break;
    tag.lastIndex = lt;
    const m = tag.exec(body);
    if (!m) throw new Error(`malformed tag at ${lt}: ${body.slice(lt, lt + 60)}`);
    const [, close, name, attrText, selfClose] = m;
    if (close) {
      if (stack.pop()?.name !== name) throw new Error(`</${name}> does not close the open element`);
    } else {
      if (stack.length === 0 && ++roots > 1) throw new Error("more than one root element");
      const attrs: Record<string, string> = {};
      for (const a of attrText!.matchAll(/([\w:-]+)="([^"]*)"/g)) {
        if (a[1]! in attrs) throw new Error(`duplicate attribute ${a[1]}`);
        cleanText(a[2]!, `attribute ${a[1]}`);
        attrs[a[1]!] = a[2]!;
      }
      out.push({ name: name!, attrs, text: "" });
      if (!selfClose) stack.push({ name: name!, at: out.length - 1 });
    }
    i = tag.lastIndex;
  }
  if (stack.length > 0) throw new Error(`unclosed: ${stack.map((e) => e.name).join(" > ")}`);
  if (roots !== 1) throw new Error("no root element");
  return out;
}

/** One series named "s" in a plain panel. */
const plotOf = (points: Point[]) =>
  linePlot({ title: "t", xLabel: "x", yLabel: "y", series: [{ name: "s", points }] });

const level = (kind: "rate" | "concurrency", value: number, ttft: number, tokens: number): LevelSummary =>
  summarize({ kind, value }, [{ ok: true, status: 200, ttft, e2e: ttft * 2, outputTokens: tokens }], 1);

describe("the checker itself", () => {
  it("rejects what a parser would", () => {
    expect(() => parseXml("<svg><g></svg>")).toThrow();
    expect(() => parseXml("<svg><text>a < b</text></svg>")).toThrow();
    expect(() => parseXml("<svg><text>R&D</text></svg>")).toThrow();
    expect(() => parseXml('<svg a="1" a="2"/>')).toThrow();
    expect(() => parseXml("<svg/><svg/>")).toThrow();
    expect(parseXml('<svg><text x="1">R&amp;D</text></svg>')).toHaveLength(2);
  });
});

describe("SVG plots", () => {
  it("draws a well-formed figure with one line and legend entry per series", () => {
    const svg = linePlot({
      title: "TTFT <p90> & friends",
      xLabel: "offered rate (req/s)",
      yLabel: "ms",
      series: [
        {
          name: "round-robin",
          points: [
            { x: 1, y: 10 },
            { x: 2, y: 30 },
            { x: 4, y: 400 },
          ],
        },
        {
          name: "prefix & load",
          points: [
            { x: 1, y: 9 },
            { x: 2, y: 12 },
            { x: 4, y: 50 },
          ],
        },
      ],
    });
    const els = parseXml(svg);
    expect(els[0]!.name).toBe("svg");
    expect(els[0]!.attrs.xmlns).toBe("http://www.w3.org/2000/svg");
    // Its accessible name comes first.
    expect(els[1]).toMatchObject({ name: "title", text: "TTFT &lt;p90&gt; &amp; friends" });
    const series = els.filter((e) => e.attrs.class === "series");
    expect(series.map((s) => s.attrs["data-name"])).toEqual(["round-robin", "prefix &amp; load"]);
    expect(els.filter((e) => e.name === "circle")).toHaveLength(6);
    const texts = els.filter((e) => e.name === "text").map((e) => e.text);
    expect(texts).toContain("TTFT &lt;p90&gt; &amp; friends");
    expect(texts).toContain("round-robin");
    expect(texts).toContain("prefix &amp; load");
    // y ticks run from 0 to a round number above the largest value.
    expect(texts).toContain("0");
    expect(texts).toContain("400");
    // Different colours for the two series.
    expect(series[0]!.attrs.stroke).not.toBe(series[1]!.attrs.stroke);
    // Two lines.
    expect(svg.match(/<path d="M[^"]*L/g)).toHaveLength(2);
  });

  it("places points where their values are: larger y higher up, larger x further right", () => {
    const svg = plotOf([
      { x: 4, y: 1 },
      { x: 1, y: 3 },
    ]);
    const dots = parseXml(svg)
      .filter((e) => e.name === "circle")
      .map((e) => ({ x: Number(e.attrs.cx), y: Number(e.attrs.cy) }));
    // Drawn in x order: (1, 3) first.
    expect(dots[0]!.x).toBeLessThan(dots[1]!.x);
    expect(dots[0]!.y).toBeLessThan(dots[1]!.y);
  });

  it("leaves a gap where a value is missing", () => {
    const svg = plotOf([
      { x: 1, y: 1 },
      { x: 2, y: 2 },
      { x: 3, y: null },
      { x: 4, y: 3 },
      { x: 5, y: 4 },
    ]);
    const d = /<path d="(M[^"]*)" fill="none" stroke-width/.exec(svg)![1]!;
    expect(d.match(/M/g)).toHaveLength(2);
    expect(d.match(/L/g)).toHaveLength(2);
  });

  it("survives empty and flat data", () => {
    expect(() =>
      parseXml(svgFigure([{ title: "empty", xLabel: "x", yLabel: "y", series: [] }])),
    ).not.toThrow();
    const flat = plotOf([{ x: 2, y: 5 }]);
    expect(flat).not.toMatch(/NaN|Infinity/);
    parseXml(flat);
  });

  it("draws the load figure: TTFT p90 and throughput against load, a series per run, in both panels", () => {
    const runs = [
      { name: "round-robin", levels: [level("rate", 1, 0.05, 100), level("rate", 4, 0.9, 300)] },
      { name: "prefix-aware", levels: [level("rate", 1, 0.04, 100), level("rate", 4, 0.2, 380)] },
    ];
    const svg = loadFigure(runs, { title: "b2b-saas\n150 groups" });
    const els = parseXml(svg);
    const texts = els.filter((e) => e.name === "text").map((e) => e.text);
    expect(texts).toEqual(
      expect.arrayContaining(["b2b-saas", "150 groups", "TTFT p90 (ms)", "output tokens/s"]),
    );
    expect(texts.filter((t) => t === "offered rate (req/s)")).toHaveLength(2);
    const series = els.filter((e) => e.attrs.class === "series").map((e) => e.attrs["data-name"]);
    expect(series).toEqual(["round-robin", "prefix-aware", "round-robin", "prefix-aware"]);
    // TTFT is plotted in ms: 900 ms needs a 1000 tick.
    expect(texts).toContain("1000");
    expect(loadFigure([{ name: "c", levels: [level("concurrency", 8, 0.1, 10)] }])).toContain(
      "concurrency (streams)",
    );
  });
});

describe("helpers", () => {
  it("steps ticks by 1, 2 or 5 × 10^k", () => {
    expect(niceStep(10)).toBe(2);
    expect(niceStep(400)).toBe(100);
    expect(niceStep(0.37)).toBe(0.1);
    expect(niceStep(23)).toBe(5);
  });

  it("escapes XML and wraps text at spaces", () => {
    expect(escapeXml(`a<b>&"'`)).toBe("a&lt;b&gt;&amp;&quot;&apos;");
    expect(wrap("one two three four", 9)).toEqual(["one two", "three", "four"]);
    expect(wrap("a\nb", 80)).toEqual(["a", "b"]);
    expect(wrap("", 80)).toEqual([]);
  });
});
