/**
 * The admin token, kept in this tab's sessionStorage. A link may carry it in
 * the fragment (`/#token=…`, what `npm start` prints): browsers never send a
 * fragment to the server, so the token stays out of access logs, and it is
 * removed from the address bar once read.
 */
const KEY = "llmgw.admin-token";

export function takeTokenFromUrl(): void {
  const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (!m?.[1]) return;
  sessionStorage.setItem(KEY, decodeURIComponent(m[1]));
  history.replaceState(null, "", location.pathname + location.search);
}

export const storedToken = (): string | null => sessionStorage.getItem(KEY);

export const storeToken = (token: string): void => sessionStorage.setItem(KEY, token);

export const forgetToken = (): void => sessionStorage.removeItem(KEY);
