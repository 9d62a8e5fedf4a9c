/**
 * An unbounded single-consumer queue exposed as an async iterable: the shape
 * Connect's streaming calls take for outgoing messages. Closing ends the
 * iteration after what is already queued.
 */
export class AsyncQueue<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private wake: (() => void) | undefined;
  private closed = false;

  push(item: T): boolean {
    if (this.closed) return false;
    this.items.push(item);
    this.wake?.();
    return true;
  }

  close(): void {
    this.closed = true;
    this.wake?.();
  }

  get isClosed(): boolean {
    return this.closed;
  }

  get length(): number {
    return this.items.length;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for (;;) {
      while (this.items.length > 0) yield this.items.shift()!;
      if (this.closed) return;
      await new Promise<void>((resolve) => {
        this.wake = resolve;
      });
      this.wake = undefined;
    }
  }
}
