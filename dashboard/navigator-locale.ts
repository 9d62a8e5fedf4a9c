/**
 * Imported first by main.tsx, so that it runs before any module that reads
 * navigator.language as it loads (uPlot does): when the browser's language is
 * not a tag Intl accepts, navigator says the safe one instead (see locale.ts).
 */
import { safeLocale } from "./locale.ts";

const reported = [navigator.language, ...navigator.languages];
const locale = safeLocale(reported);
if (!reported.every(accepted)) {
  Object.defineProperty(navigator, "language", { value: locale, configurable: true });
  Object.defineProperty(navigator, "languages", { value: Object.freeze([locale]), configurable: true });
}

function accepted(tag: string): boolean {
  try {
    new Intl.NumberFormat(tag);
    return true;
  } catch {
    return false;
  }
}
