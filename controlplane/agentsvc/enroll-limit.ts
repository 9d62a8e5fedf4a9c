import { isIPv6 } from "node:net";

/**
 * Enroll is the one call on the agent listener anyone may make, so it is
 * limited per source: a token bucket of `perMinute` calls refilled evenly
 * over a minute. IPv6 sources count per /64, which is what one host
 * usually has to hop between. Failures are counted per source as well, for
 * the log line that names it.
 */
export interface EnrollSource {
  key: string;
  tokens: number;
  at: number;
  failures: number;
  /** When a rate-limited call was last logged: one such line per source and minute. */
  loggedAt: number;
}

/** Sources kept at most; the least recently seen go first beyond it. */
const MAX_SOURCES = 10_000;

export function sourceKey(address: string | undefined): string {
  if (!address) return "unknown";
  const v4 = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address)?.[1];
  if (v4) return v4;
  if (!isIPv6(address)) return address;
  return `${expandV6(address).slice(0, 4).join(":")}::/64`;
}

function expandV6(a: string): string[] {
  const [head, tail] = a.split("::") as [string, string | undefined];
  const h = head ? head.split(":") : [];
  const t = tail ? tail.split(":") : [];
  const fill = tail === undefined ? [] : Array(8 - h.length - t.length).fill("0");
  return [...h, ...fill, ...t].map((x) => x.toLowerCase().replace(/^0+(?=.)/, ""));
}

export class EnrollLimiter {
  private readonly sources = new Map<string, EnrollSource>();
  limited = 0;

  constructor(private readonly perMinute: number) {}

  /** Takes one call from the source's budget; false when there is none left. */
  take(address: string | undefined, now: number): { ok: boolean; source: EnrollSource; retryInMs: number } {
    const key = sourceKey(address);
    let s = this.sources.get(key);
    if (s)
      this.sources.delete(key); // re-inserted: the map's order is recency
    else s = { key, tokens: this.perMinute, at: now, failures: 0, loggedAt: 0 };
    s.tokens = Math.min(this.perMinute, s.tokens + ((now - s.at) * this.perMinute) / 60_000);
    s.at = now;
    this.sources.set(key, s);
    if (this.sources.size > MAX_SOURCES) this.sources.delete(this.sources.keys().next().value!);
    if (s.tokens >= 1) {
      s.tokens -= 1;
      return { ok: true, source: s, retryInMs: 0 };
    }
    this.limited++;
    return { ok: false, source: s, retryInMs: Math.ceil(((1 - s.tokens) * 60_000) / this.perMinute) };
  }
}
