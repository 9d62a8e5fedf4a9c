/** `HOST:PORT` or `:PORT` (`[::1]:9090` for IPv6), as every listen setting and flag takes it. */
export const LISTEN_ADDRESS = /^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]*):\d{1,5}$/;

/** `:9090`, `127.0.0.1:9090` or `[::1]:9090` → what `server.listen` takes. */
export function parseListen(addr: string): { host: string | undefined; port: number } {
  const i = addr.lastIndexOf(":");
  const host = addr.slice(0, i).replace(/^\[(.*)\]$/, "$1");
  return { host: host === "" ? undefined : host, port: Number(addr.slice(i + 1)) };
}
