import { type SiteRow, shareText } from "../../common/site-shares.ts";
import { renderTable } from "./table.ts";

export { type SiteRow, shareText, siteRows } from "../../common/site-shares.ts";

/** `ctl status`'s SITES table (common/site-shares.ts says what each column is). */
export function sitesTable(rows: readonly SiteRow[]): string {
  return renderTable(
    ["model", "site", "endpoint set", "endpoints", "ready", "load feed", "routed", "last minute", "share"],
    rows.map((r) => [
      r.model,
      r.site,
      `v${r.version}`,
      String(r.endpoints),
      String(r.ready),
      r.loadFeed,
      String(r.routed),
      String(r.routedLastMinute),
      shareText(r.share),
    ]),
  );
}
