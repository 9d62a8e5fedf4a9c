import { useEffect, useRef, useState } from "preact/hooks";

export interface Polled<T> {
  data: T | undefined;
  /** The last call's error; the last good data stays shown beside it. */
  error: unknown;
  at: number;
}

/**
 * Calls `load` now and `everyMs` after each answer (never two at once), for
 * as long as the component lives. Live views poll at most every 2 s (issue 16).
 */
export function usePoll<T>(load: () => Promise<T>, everyMs: number): Polled<T> {
  const [state, setState] = useState<Polled<T>>({ data: undefined, error: undefined, at: 0 });
  const loadRef = useRef(load);
  loadRef.current = load;
  useEffect(() => {
    let stopped = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const tick = async () => {
      try {
        const data = await loadRef.current();
        if (!stopped) setState({ data, error: undefined, at: Date.now() });
      } catch (error) {
        if (!stopped) setState((s) => ({ ...s, error }));
      }
      if (!stopped) timer = setTimeout(tick, everyMs);
    };
    void tick();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, [everyMs]);
  return state;
}
