/**
 * Synthetic chat workloads: what `llmgw bench` sends to a real URL and what
 * the routing simulation (`npm run bench:routing`) replays on a virtual
 * clock. One generator serves both, so a real run and a simulated one see
 * the same prompts, sessions, bands and arrival times.
 *
 * Pure and deterministic: a workload's options and a seed fix everything.
 *
 * Token counts are approximate on purpose. Text is made of words of one to
 * three letters, which the usual BPE tokenizers (and the sim engine's,
 * sim-engine/text.ts) count as about one token each, ≈ 4 characters
 * per token with the space; a text of N requested tokens is N such words
 * after a short tag. The chat template adds its own few tokens per message.
 *
 * Speed: tens of thousands of requests with 6k-token system prompts must not
 * build 6k-token strings per request. Each group's system prompt is built
 * once and reused; questions and synthetic answers are slices of one shared
 * word corpus (V8 shares a slice's memory with the string it came from).
 */
import { mix32, mulberry32 } from "../common/rng.ts";

export interface ChatMessage {
  role: "system" | "user" | "assistant";
  content: string;
}

export interface WorkloadRequest {
  /** Unique, stable for a seed: `<workload>-<seed>-<position in the sequence>`. */
  id: string;
  /** Seconds from the start (open loop: Poisson at the given rate). Without a rate, 0: only the order matters. */
  at: number;
  messages: ChatMessage[];
  /** The request's max_tokens. */
  maxTokens: number;
  /** Ask the engine to generate exactly maxTokens (vLLM's `ignore_eos`). */
  ignoreEos?: boolean;
  /** Sent as x-session-id: one per conversation (a group's user). */
  session?: string;
  /** Sent as x-llmgw-band. */
  band?: string;
  /** Shared-prefix group, for reporting. */
  group?: number;
  /** 0-based turn within the conversation (shared-prefix). */
  turn?: number;
}

export interface RequestsOptions {
  /** Requests per second for Poisson arrival times; omitted: every `at` is 0. */
  rate?: number;
  seed: number;
  /**
   * Skip this many requests of the sequence first, so a sweep's levels can
   * continue one sequence (conversations go on) instead of repeating it.
   */
  start?: number;
}

export interface Workload {
  name: string;
  describe(): string;
  requests(opts: RequestsOptions & { count: number }): WorkloadRequest[];
  /** The same sequence, unbounded: for runs measured by duration. */
  iterate(opts: RequestsOptions): Iterator<WorkloadRequest>;
}

export interface SharedPrefixOptions {
  groups: number;
  usersPerGroup: number;
  systemTokens: number;
  questionTokens: number;
  outputTokens: number;
  /**
   * Turns per conversation. A user's k-th turn carries the system prompt and
   * its earlier questions and (synthetic) answers; after the last turn the
   * user starts a new conversation (a new session). 1 = single-turn.
   */
  turns: number;
  ignoreEos: boolean;
}

export interface RandomOptions {
  promptTokens: number;
  /** Prompt length is uniform in promptTokens × [1 − spread, 1 + spread]. */
  spread: number;
  outputTokens: number;
  ignoreEos: boolean;
}

export type BandWeights = Record<string, number>;

export type BandMixOptions =
  | ({ base: "random"; bands: BandWeights } & RandomOptions)
  | ({ base: "shared-prefix"; bands: BandWeights } & SharedPrefixOptions);

export const SHARED_PREFIX_DEFAULTS: SharedPrefixOptions = {
  groups: 10,
  usersPerGroup: 5,
  systemTokens: 2000,
  questionTokens: 200,
  outputTokens: 200,
  turns: 5,
  ignoreEos: false,
};

export const RANDOM_DEFAULTS: RandomOptions = {
  promptTokens: 1000,
  spread: 0.2,
  outputTokens: 200,
  ignoreEos: false,
};

export const DEFAULT_BANDS: BandWeights = { platinum: 0.1, gold: 0.3, silver: 0.3, bronze: 0.3 };

// ---------------------------------------------------------------------------
// Text

/** Short common words: about one token each in BPE vocabularies, exactly one in the sim's tokenizer. */
const WORDS = (
  "the of and to in is it you he was for on are as his at be by one had but not all we can an " +
  "she do how if up out so her him has two see now way who its did get may day use new our any " +
  "few man old set put end why try ask men run own say big far sea eye off add act let car cut " +
  "top low yes yet air law sun job lot war age ago art bed box boy dog ear egg fly fun gas hot " +
  "ice key map mix net oil pay pen red sky tax tea ten toy van win arm bad bag bit bus cap cow"
).split(" ");

const CORPUS_WORDS = 1 << 16;
let corpus: { text: string; offsets: Uint32Array } | undefined;

/** One fixed corpus for every workload: which slice a text takes is what the seed decides. */
function sharedCorpus(): { text: string; offsets: Uint32Array } {
  if (corpus) return corpus;
  const next = mulberry32(0x1b2e_c0de);
  const offsets = new Uint32Array(CORPUS_WORDS + 1);
  const parts: string[] = [];
  let at = 0;
  for (let i = 0; i < CORPUS_WORDS; i++) {
    const word = ` ${WORDS[Math.floor(next() * WORDS.length)]}`;
    offsets[i] = at;
    parts.push(word);
    at += word.length;
  }
  offsets[CORPUS_WORDS] = at;
  corpus = { text: parts.join(""), offsets };
  return corpus;
}

/** `n` words (each with its leading space) from a random place in the corpus. */
function words(next: () => number, n: number): string {
  const { text, offsets } = sharedCorpus();
  let out = "";
  for (let left = n; left > 0; ) {
    const take = Math.min(left, CORPUS_WORDS);
    const from = Math.floor(next() * (CORPUS_WORDS - take + 1));
    out += text.slice(offsets[from], offsets[from + take]);
    left -= take;
  }
  return out;
}

/**
 * A tag that starts a text: a letter, then the number's base-36 digits
 * lowest first, so numbers below 36³ differ within the first four
 * characters (one token for the sim, the first block for a prefix hash).
 */
export function tag(letter: string, n: number): string {
  const digits = n.toString(36).split("").reverse().join("");
  return letter + digits.padEnd(3, "0");
}

// ---------------------------------------------------------------------------
// Sequences

interface Content {
  messages: ChatMessage[];
  maxTokens: number;
  session?: string;
  group?: number;
  turn?: number;
}

/** An endless content sequence for a seed: call it for request 0, 1, 2, ... in order. */
type ContentSource = (index: number) => Content;

/** Stream numbers for mix32(seed, stream): independent RNGs per purpose. */
const PICK = 1;
const TEXT = 2;
const ARRIVALS = 3;
const BANDS = 4;
const SYSTEM = 5;

function makeWorkload(
  name: string,
  describe: () => string,
  ignoreEos: boolean,
  source: (seed: number) => ContentSource,
  label?: (seed: number) => (index: number) => string,
): Workload {
  function* iterate(opts: RequestsOptions): Generator<WorkloadRequest> {
    const start = opts.start ?? 0;
    const content = source(opts.seed);
    const bandOf = label?.(opts.seed);
    const arrivals = mulberry32(mix32(mix32(opts.seed, ARRIVALS), start));
    for (let i = 0; i < start; i++) content(i);
    let t = 0;
    for (let i = start; ; i++) {
      const c = content(i);
      // Poisson arrivals: exponential gaps; 1 − u keeps the logarithm finite.
      if (opts.rate !== undefined) t += -Math.log(1 - arrivals()) / opts.rate;
      const band = bandOf?.(i);
      yield {
        id: `${name}-${opts.seed}-${i}`,
        at: t,
        ...c,
        ignoreEos,
        ...(band !== undefined ? { band } : {}),
      };
    }
  }
  return {
    name,
    describe,
    iterate,
    requests(opts) {
      const out: WorkloadRequest[] = [];
      const it = iterate(opts);
      while (out.length < opts.count) out.push(it.next().value as WorkloadRequest);
      return out;
    },
  };
}

function sharedPrefixSource(o: SharedPrefixOptions): (seed: number) => ContentSource {
  return (seed) => {
    const pick = mulberry32(mix32(seed, PICK));
    const text = mulberry32(mix32(seed, TEXT));
    const systems: ChatMessage[] = [];
    const system = (g: number): ChatMessage => {
      systems[g] ??= {
        role: "system",
        content: tag("g", g) + words(mulberry32(mix32(mix32(seed, SYSTEM), g)), o.systemTokens),
      };
      return systems[g]!;
    };
    interface Conversation {
      number: number;
      turn: number;
      history: ChatMessage[];
    }
    const conversations = new Map<number, Conversation>();
    const sessionPrefix = `s${(seed >>> 0).toString(36)}`;
    return (index) => {
      const group = Math.floor(pick() * o.groups);
      const user = Math.floor(pick() * o.usersPerGroup);
      const key = group * o.usersPerGroup + user;
      let c = conversations.get(key);
      if (!c || c.turn >= o.turns) {
        c = { number: (c?.number ?? -1) + 1, turn: 0, history: [system(group)] };
        conversations.set(key, c);
      }
      const question: ChatMessage = {
        role: "user",
        content: tag("q", index) + words(text, o.questionTokens),
      };
      const messages = [...c.history, question];
      const turn = c.turn++;
      if (c.turn < o.turns) {
        c.history.push(question, { role: "assistant", content: words(text, o.outputTokens) });
      }
      return {
        messages,
        maxTokens: o.outputTokens,
        session: `${sessionPrefix}-g${group}-u${user}-c${c.number}`,
        group,
        turn,
      };
    };
  };
}

function randomSource(o: RandomOptions): (seed: number) => ContentSource {
  return (seed) => {
    const pick = mulberry32(mix32(seed, PICK));
    const text = mulberry32(mix32(seed, TEXT));
    return (index) => {
      const scale = 1 + o.spread * (2 * pick() - 1);
      const n = Math.max(1, Math.round(o.promptTokens * scale));
      return {
        messages: [{ role: "user", content: tag("r", index) + words(text, n) }],
        maxTokens: o.outputTokens,
      };
    };
  };
}

function describeSharedPrefix(o: SharedPrefixOptions): string {
  const turns = o.turns === 1 ? "single-turn" : `${o.turns} turns per conversation`;
  return (
    `shared-prefix: ${o.groups} groups × ${o.usersPerGroup} users, ${o.systemTokens}-token system prompts, ` +
    `${o.questionTokens}-token questions, ${o.outputTokens} output tokens${o.ignoreEos ? " (ignore_eos)" : ""}, ${turns}`
  );
}

function describeRandom(o: RandomOptions): string {
  const spread = o.spread > 0 ? ` ± ${Math.round(o.spread * 100)} %` : "";
  return `random: ${o.promptTokens}${spread}-token unique prompts, ${o.outputTokens} output tokens${o.ignoreEos ? " (ignore_eos)" : ""}`;
}

export function sharedPrefix(options: Partial<SharedPrefixOptions> = {}): Workload {
  const o = { ...SHARED_PREFIX_DEFAULTS, ...options };
  return makeWorkload("shared-prefix", () => describeSharedPrefix(o), o.ignoreEos, sharedPrefixSource(o));
}

export function randomPrompts(options: Partial<RandomOptions> = {}): Workload {
  const o = { ...RANDOM_DEFAULTS, ...options };
  return makeWorkload("random", () => describeRandom(o), o.ignoreEos, randomSource(o));
}

/** Every request of a base workload, labelled with a band drawn from a weighted mix. */
export function bandMix(options: BandMixOptions): Workload {
  const entries = Object.entries(options.bands).filter(([, w]) => w > 0);
  const total = entries.reduce((s, [, w]) => s + w, 0);
  if (entries.length === 0 || !(total > 0))
    throw new Error("band-mix needs at least one band with a positive weight");
  const mix = entries.map(([b, w]) => `${b} ${Math.round((w / total) * 100)} %`).join(", ");
  const label = (seed: number) => {
    const next = mulberry32(mix32(seed, BANDS));
    return () => {
      let u = next() * total;
      for (const [band, w] of entries) {
        u -= w;
        if (u < 0) return band;
      }
      return entries[entries.length - 1]![0];
    };
  };
  let base: string;
  let source: (seed: number) => ContentSource;
  if (options.base === "shared-prefix") {
    const o = { ...SHARED_PREFIX_DEFAULTS, ...options };
    [base, source] = [describeSharedPrefix(o), sharedPrefixSource(o)];
  } else {
    const o = { ...RANDOM_DEFAULTS, ...options };
    [base, source] = [describeRandom(o), randomSource(o)];
  }
  return makeWorkload("band-mix", () => `band-mix (${mix}) over ${base}`, options.ignoreEos, source, label);
}
