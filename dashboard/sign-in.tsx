import { useState } from "preact/hooks";
import { controlClient, errorText } from "./client.ts";

/**
 * Asks for the admin token and tries it with one read call before keeping
 * it, so a wrong token is told at once, in the control plane's words.
 */
export function SignIn(props: { error: string | null; onSignedIn: (token: string) => void }) {
  const [token, setToken] = useState("");
  const [error, setError] = useState(props.error);
  const [busy, setBusy] = useState(false);
  const submit = async (e: Event) => {
    e.preventDefault();
    const t = token.trim();
    if (!t) return setError("Enter the admin token.");
    setBusy(true);
    try {
      await controlClient(t).listNodes({});
      props.onSignedIn(t);
    } catch (err) {
      setError(`Sign-in failed: ${errorText(err)}`);
    } finally {
      setBusy(false);
    }
  };
  return (
    <main class="sign-in">
      <h1>llmgw</h1>
      <form onSubmit={submit}>
        <label for="token">Admin token</label>
        <input
          id="token"
          type="password"
          autocomplete="off"
          value={token}
          onInput={(e) => setToken((e.target as HTMLInputElement).value)}
        />
        <button type="submit" disabled={busy}>
          Sign in
        </button>
        {error ? (
          <p class="error" role="alert">
            {error}
          </p>
        ) : null}
        <p class="hint">
          The token the control plane was started with ($LLMGW_ADMIN_TOKEN or admin.token_file; `npm start`
          keeps it in .state/admin.token). It stays in this tab only.
        </p>
      </form>
    </main>
  );
}
