/**
 * The keys engines placed here require of whoever calls their API
 * (docs/security.md, "Engine keys"). Each placement of a replica (its id
 * and generation) gets its own, derived from one secret the control plane
 * keeps in its database: a key read off one node (its process list, its
 * agent's state) opens that engine and no other, and dies with it when the
 * replica is placed again (a lost or revoked node's replicas get new
 * generations elsewhere). The derivation needs no table of keys. It gives
 * the key an engine is launched with; what the edge is sent for a running
 * engine is the key its agent reports (Reconciler.launchedKey), so a
 * restarted control plane, even one with another secret, touches no engine.
 */
import { createHmac, randomBytes } from "node:crypto";
import { OneRowStore } from "./one-row-store.ts";

const SECRET_BYTES = 32;
// Names what the HMAC is for, so this secret could key something else one
// day without two uses ever yielding the same value.
const PURPOSE = "llmgw engine api key v1";

/** A replica's key: printable ASCII, since it goes into a header and an argv. */
export function engineKeyFor(secret: Uint8Array, replicaId: string, generation: number): string {
  const mac = createHmac("sha256", secret).update(`${PURPOSE}\0${replicaId}\0${generation}`);
  return `llmgw-e-${mac.digest("base64url")}`;
}

/** A placement's engine key: the replica and the generation it was launched as. */
export type EngineKeyOf = (replicaId: string, generation: number) => string;

export interface EngineKeys {
  forReplica: EngineKeyOf;
  close(): void;
}

/** The control plane's engine keys, from the secret in `db`, made on the first start. */
export function openEngineKeys(db: string, now: number): EngineKeys {
  const store = new OneRowStore<Uint8Array>(db, {
    table: "engine_key_secret",
    column: "secret",
    type: "BLOB",
    writtenAt: "created_at_ms",
  });
  let secret = store.read();
  if (!secret || secret.byteLength < SECRET_BYTES) {
    secret = new Uint8Array(randomBytes(SECRET_BYTES));
    store.write(secret, now);
  }
  const held = new Uint8Array(secret);
  return {
    forReplica: (replicaId, generation) => engineKeyFor(held, replicaId, generation),
    close: () => store.close(),
  };
}
