/**
 * The admin listener answers only requests addressed to it: by an IP
 * address, or by one of its names (`localhost`, the machine's hostname,
 * admin_listen's host, `admin.allowed_hosts`). A web page on another name
 * that a browser on the control plane's host opens cannot then reach the
 * admin API by pointing its own name at 127.0.0.1 (DNS rebinding): the
 * browser still sends that name as Host.
 */
const IPV4 = /^\d{1,3}(\.\d{1,3}){3}$/;

/** The host part of a Host header, lower-cased, without port or trailing dot. */
export function hostOf(header: string): string {
  const h = header.trim().toLowerCase();
  if (h.startsWith("[")) return h.slice(0, h.indexOf("]") + 1);
  const colon = h.lastIndexOf(":");
  return (colon >= 0 ? h.slice(0, colon) : h).replace(/\.$/, "");
}

/** Whether a request with this Host header is addressed to this listener. */
export function hostAllowed(header: string | undefined, names: ReadonlySet<string>): boolean {
  // Browsers always send Host; a client that sends none is not a web page.
  if (header === undefined || header === "") return true;
  const host = hostOf(header);
  return IPV4.test(host) || host.startsWith("[") || names.has(host);
}
