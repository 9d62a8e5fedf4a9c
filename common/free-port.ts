import { createServer } from "node:net";

/** A port that was free a moment ago, for a process about to bind it. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      if (typeof addr !== "object" || addr === null) return reject(new Error("no address"));
      srv.close(() => resolve(addr.port));
    });
  });
}
