import { errorMessage, type Logger } from "../../common/log.ts";
import type { ShardLoad } from "../../proto/gen/agent/v1/agent_pb.ts";
import type { EngineLaunch } from "../engines/adapter.ts";
import { LoadScraper } from "../scraper.ts";

/** router.scrape_interval and scrape_timeout; one object for all shards, changed in place when the control plane says so. */
export interface ScrapeSettings {
  intervalMs: number;
  timeoutMs: number;
}

/**
 * One engine's load, scraped every interval while it serves. Load is not
 * lifecycle: it goes out on its own (`onLoad`) and changes no state. Drain
 * asks it for the requests in flight. One scraper per engine, shared by
 * both, since vLLM's hit rate is a rate between consecutive scrapes.
 */
export class LoadWatch {
  private readonly scraper: LoadScraper;
  private wakeUp: (() => void) | undefined;

  constructor(
    launch: EngineLaunch & { metricsPath: string },
    private readonly settings: ScrapeSettings,
    private readonly onLoad: (load: ShardLoad) => void,
    private readonly log: Logger,
    private readonly replicaId: string,
    private readonly onScrapeError: () => void = () => {},
  ) {
    this.scraper = new LoadScraper(
      launch.probeHost,
      launch.port,
      launch.metricsPath,
      launch.metricNames,
      () => settings.timeoutMs,
      Date.now,
      { maxNumSeqs: launch.maxNumSeqs ?? 0, probe: launch.capacityProbe, apiKey: launch.apiKey },
      (outcome) => {
        if ("learned" in outcome)
          log.info("engine's capacity learned from its server info", {
            replica: replicaId,
            max_num_seqs: outcome.learned.maxNumSeqs ?? "not stated",
            kv_tokens: outcome.learned.kvTokens ?? "not stated",
          });
        // Once: an engine that never answers is asked every minute, and says so only the first time.
        else if (outcome.failures === 1)
          log.warn(
            "engine's server info unreadable: its batch stays what its launch says while it is asked again",
            {
              replica: replicaId,
              error: outcome.error,
            },
          );
      },
    );
  }

  /** Scrapes now and every interval until `signal` aborts. */
  async run(signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      try {
        const { load, errors } = await this.scraper.scrape();
        if (signal.aborted) return;
        if (errors.length) this.log.debug("malformed metrics lines", { replica: this.replicaId, errors });
        this.onLoad(load);
      } catch (err) {
        this.onScrapeError();
        this.log.debug("scrape failed", { replica: this.replicaId, error: errorMessage(err) });
      }
      await this.pause(signal);
    }
  }

  /** A new interval applies at once: the pending scrape runs now, then the new pace follows. */
  retune(): void {
    this.wakeUp?.();
  }

  /** Running + waiting; undefined when the scrape fails. */
  async inFlight(): Promise<number | undefined> {
    try {
      const { reading, load } = await this.scraper.scrape();
      this.onLoad(load);
      return reading.running + reading.waiting;
    } catch {
      return undefined;
    }
  }

  private pause(signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        signal.removeEventListener("abort", done);
        this.wakeUp = undefined;
        resolve();
      };
      const timer = setTimeout(done, this.settings.intervalMs);
      signal.addEventListener("abort", done, { once: true });
      this.wakeUp = done;
    });
  }
}
