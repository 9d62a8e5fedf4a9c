import { createServer } from "node:net";

/**
 * `npm start` checks its listeners' ports before it starts anything: a port
 * taken (an earlier stack still running, another program) otherwise shows
 * as one process's exit among the logs of the others, or as a start that
 * waits until its deadline.
 */
export interface StackPort {
  port: number;
  /** What listens there, for the message. */
  what: string;
  /** The flag that moves it. */
  flag: string;
}

/** Null when `port` on `host` can be bound now, else the error code (EADDRINUSE, EACCES, …). */
function bindable(host: string, port: number): Promise<string | null> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once("error", (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
    server.listen(port, host, () => server.close(() => resolve(null)));
  });
}

/** The message for the first port that cannot be bound, or null when all can. */
export async function portProblem(ports: readonly StackPort[], host = "127.0.0.1"): Promise<string | null> {
  for (const p of ports) {
    const code = await bindable(host, p.port);
    if (code === null) continue;
    const why = code === "EADDRINUSE" ? "is already in use" : `cannot be bound (${code})`;
    return `port ${p.port} (${p.what}) on ${host} ${why}: stop what holds it (ss -ltnp 'sport = :${p.port}' shows it) or choose another with ${p.flag} N`;
  }
  return null;
}
