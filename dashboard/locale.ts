/**
 * The page's locale, chosen so that formatting cannot throw. A browser
 * started under a POSIX locale such as C.UTF-8 reports its language as
 * `en-US@posix`, which no Intl constructor accepts: `new Intl.NumberFormat(
 * navigator.language)` (uPlot runs one as it loads) throws `RangeError:
 * Invalid language tag` and the page renders nothing.
 */

/** The first of the browser's languages that Intl accepts once POSIX decorations are cut off; else `en-US`. */
export function safeLocale(candidates: readonly string[]): string {
  for (const raw of candidates) {
    // `en_US.UTF-8@euro` → `en-US`: the codeset and modifier are POSIX's, not BCP 47's.
    const tag = raw.split(/[.@]/, 1)[0]!.replaceAll("_", "-");
    if (tag === "" || tag === "C" || tag === "POSIX") continue;
    try {
      const [canonical] = Intl.getCanonicalLocales(tag);
      if (canonical) return new Intl.NumberFormat(canonical).resolvedOptions().locale;
    } catch {
      // Not a language tag at all: try the next.
    }
  }
  return "en-US";
}
