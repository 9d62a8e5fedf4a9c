// First: it makes navigator.language safe before uPlot reads it as it loads.
import "./navigator-locale.ts";
import { render } from "preact";
import { useCallback, useState } from "preact/hooks";
import "uplot/dist/uPlot.min.css";
import "./style.css";
import { Dashboard } from "./dashboard.tsx";
import { SignIn } from "./sign-in.tsx";
import { forgetToken, storedToken, storeToken, takeTokenFromUrl } from "./token.ts";

function App() {
  const [token, setToken] = useState(storedToken);
  const [why, setWhy] = useState<string | null>(null);
  const signOut = useCallback((reason: string | null) => {
    forgetToken();
    setWhy(reason);
    setToken(null);
  }, []);
  if (!token)
    return (
      <SignIn
        error={why}
        onSignedIn={(t) => {
          storeToken(t);
          setToken(t);
        }}
      />
    );
  return <Dashboard token={token} onSignOut={signOut} />;
}

takeTokenFromUrl();
render(<App />, document.getElementById("app")!);
