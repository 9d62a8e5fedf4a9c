import { createHash, randomBytes } from "node:crypto";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { parseDuration } from "../../common/duration.ts";
import { DEFAULT_EDGE, type EdgeSyncClient, edgeSyncClient, edgeUrl } from "../../common/edgesync-client.ts";
import { expired, MAX_EXPIRY_MS } from "../../common/key-expiry.ts";
import { recordFields } from "../../edge/keys/api-key.ts";
import { type ApiKey, ApiKeySchema } from "../../proto/gen/edge/v1/edgesync_pb.ts";
import { EDGE_FLAGS, failure, openCommand } from "./command.ts";
import { renderTable } from "./table.ts";

/**
 * `llmgw keys create|list|revoke|usage`: API keys at the edge, over EdgeSync.
 * The secret is generated here and printed once; only its SHA-256 ever
 * leaves this process, so neither the edge nor the control plane can leak
 * a usable key.
 */

const HELP = `usage: llmgw keys <command> [--edge URL]

commands:
  create --name N --band BAND [--default-band B] [--tenant T] [--models a,b]
         [--rpm N] [--tpm N] [--budget TOKENS/PERIOD]   e.g. --budget 1000000/30d
         [--max-concurrent N]   requests in flight at once; more get 429 concurrency_limit
         [--expires 30d|2027-01-31T00:00:00Z]   from then on the key gets 401
  update ID [--name N] [--band BAND] [--default-band B] [--tenant T] [--models a,b|*]
         [--rpm N] [--tpm N] [--budget TOKENS/PERIOD|none] [--max-concurrent N]
         [--expires DURATION|DATE|never]
         change a key in place, its secret unchanged; 0 (or none) lifts a limit
  list [--json]
  revoke ID
  usage [ID] [--json]

--edge defaults to $LLMGW_EDGE_URL, else ${DEFAULT_EDGE}; the EdgeSync secret is read
from $LLMGW_EDGE_TOKEN.
`;

export function newSecret(): string {
  return `sk-llmgw-${randomBytes(32).toString("base64url")}`;
}

export function hashSecret(secret: string): string {
  return createHash("sha256").update(secret).digest("hex");
}

function positiveInt(name: string, v: string | undefined): number {
  if (v === undefined) return 0;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) throw new Error(`--${name}: expected a whole number, got "${v}"`);
  return n;
}

/**
 * `--expires`: a duration from now (`30d`) or a date (`2027-01-31`, or with
 * a time and zone); `never` (update only) lifts it. In ms since the epoch, 0 for never.
 */
export function parseExpiry(v: string | undefined, now: number, allowNever: boolean): bigint | undefined {
  if (v === undefined) return undefined;
  if (v === "never" && allowNever) return 0n;
  const at = /^\d{4}-\d{2}-\d{2}/.test(v) ? dateOf(v) : now + durationOrNaN(v);
  if (!Number.isFinite(at)) {
    throw new Error(
      `--expires: expected a duration such as 30d, a date such as 2027-01-31 or a time with its zone such as 2027-01-31T09:00:00Z${allowNever ? ", or never" : ""}, got "${v}"`,
    );
  }
  if (at <= now) throw new Error(`--expires: ${new Date(at).toISOString()} is not in the future`);
  if (at > MAX_EXPIRY_MS) throw new Error(`--expires: "${v}" is past the year 9999`);
  return BigInt(at);
}

function durationOrNaN(v: string): number {
  try {
    return parseDuration(v);
  } catch {
    return Number.NaN;
  }
}

/**
 * A calendar date (midnight UTC) or a date and time with its zone; NaN for
 * anything else, a day that does not exist (`2027-02-30`) or a time
 * without a zone, which would be read in whatever zone this machine has.
 */
function dateOf(v: string): number {
  if (/^\d{4}-\d{2}-\d{2}$/.test(v)) {
    const at = Date.parse(`${v}T00:00:00Z`);
    return Number.isFinite(at) && new Date(at).toISOString().slice(0, 10) === v ? at : Number.NaN;
  }
  if (!/T\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:\d{2})$/.test(v)) return Number.NaN;
  const day = v.slice(0, 10);
  const at = Date.parse(v);
  // The day as written must exist; the zone may move the instant to another day.
  return Number.isFinite(at) && Number.isFinite(dateOf(day)) ? at : Number.NaN;
}

export function parseBudget(v: string | undefined): { tokens: bigint; period: string } | undefined {
  if (v === undefined) return undefined;
  const m = /^(\d+)\/(\S+)$/.exec(v);
  if (!m) throw new Error(`--budget: expected TOKENS/PERIOD such as 1000000/30d, got "${v}"`);
  parseDuration(m[2]!); // refuse a bad period here rather than at the edge
  return { tokens: BigInt(m[1]!), period: m[2]! };
}

/** When the key expires, as ISO 8601, or null for never. */
function expiresAt(k: ApiKey): string | null {
  return k.expiresAtUnixMs > 0n ? new Date(Number(k.expiresAtUnixMs)).toISOString() : null;
}

function keyJson(k: ApiKey) {
  return {
    ...recordFields(k),
    budget: k.budget ? { tokens: Number(k.budget.tokens), period: k.budget.period } : null,
    created_at: new Date(Number(k.createdAtUnixMs)).toISOString(),
    expires_at: expiresAt(k),
    revoked: k.revoked,
  };
}

const FLAGS = {
  ...EDGE_FLAGS,
  name: { type: "string" },
  band: { type: "string" },
  "default-band": { type: "string" },
  tenant: { type: "string" },
  models: { type: "string" },
  rpm: { type: "string" },
  tpm: { type: "string" },
  budget: { type: "string" },
  "max-concurrent": { type: "string" },
  expires: { type: "string" },
} as const;

type Values = Exclude<ReturnType<typeof openCommand<typeof FLAGS>>, number>["values"];

export async function main(argv: string[]): Promise<number | undefined> {
  const opened = openCommand(argv, HELP, FLAGS);
  if (typeof opened === "number") return opened;
  const { command, values, positionals } = opened;
  const edge = edgeUrl(values.edge);
  const client = edgeSyncClient(edge);
  try {
    switch (command) {
      case "create":
        return await createKey(client, values);
      case "update": {
        const id = positionals[0];
        if (!id) throw new Error("usage: llmgw keys update ID [--rpm N] …");
        return await updateKey(client, id, values);
      }
      case "list":
        return await listKeys(client, values);
      case "revoke": {
        const id = positionals[0];
        if (!id) throw new Error("usage: llmgw keys revoke ID");
        await client.revokeKey({ id });
        process.stdout.write(`revoked ${id}\n`);
        return 0;
      }
      case "usage":
        return await usageKeys(client, positionals[0] ?? "", values.json ?? false);
      default:
        process.stderr.write(`llmgw keys: unknown command "${command}"\n\n${HELP}`);
        return 2;
    }
  } catch (err) {
    process.stderr.write(`llmgw keys ${command}: ${failure(err)} (edge ${edge})\n`);
    return 1;
  }
}

async function createKey(client: EdgeSyncClient, values: Values): Promise<number> {
  if (!values.name) throw new Error("--name is required");
  if (!values.band) throw new Error("--band is required (the highest band this key may use)");
  const secret = newSecret();
  const id = `key_${randomBytes(8).toString("hex")}`;
  // One instant for both, so `--expires 30d` is exactly 30 days after creation.
  const now = Date.now();
  const key = {
    id,
    hash: hashSecret(secret),
    name: values.name,
    tenant: values.tenant ?? "",
    maxBand: values.band,
    defaultBand: values["default-band"] ?? "",
    models: values.models ? modelList(values.models) : [],
    rpm: positiveInt("rpm", values.rpm),
    tpm: positiveInt("tpm", values.tpm),
    maxConcurrent: positiveInt("max-concurrent", values["max-concurrent"]),
    budget: parseBudget(values.budget),
    createdAtUnixMs: BigInt(now),
    expiresAtUnixMs: parseExpiry(values.expires, now, false) ?? 0n,
  };
  await client.putKey({ key });
  if (values.json) process.stdout.write(`${JSON.stringify({ id, secret })}\n`);
  else {
    process.stdout.write(`id:     ${id}\nsecret: ${secret}\n`);
    process.stderr.write("The secret is shown only now; the edge keeps only its SHA-256.\n");
  }
  return 0;
}

function modelList(v: string): string[] {
  if (v.trim() === "*") return [];
  return v
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
}

type KeyChanges = Partial<Omit<MessageInitShape<typeof ApiKeySchema>, "$typeName">>;

/** What `update` changes: only the flags given, each as `create` reads it. */
function changesOf(values: Values): KeyChanges {
  const out: KeyChanges = {};
  if (values.name !== undefined) out.name = values.name;
  if (values.band !== undefined) out.maxBand = values.band;
  if (values["default-band"] !== undefined) out.defaultBand = values["default-band"];
  if (values.tenant !== undefined) out.tenant = values.tenant;
  if (values.models !== undefined) out.models = modelList(values.models);
  if (values.rpm !== undefined) out.rpm = positiveInt("rpm", values.rpm);
  if (values.tpm !== undefined) out.tpm = positiveInt("tpm", values.tpm);
  if (values["max-concurrent"] !== undefined) {
    out.maxConcurrent = positiveInt("max-concurrent", values["max-concurrent"]);
  }
  if (values.budget !== undefined)
    out.budget = values.budget === "none" ? undefined : parseBudget(values.budget);
  const expires = parseExpiry(values.expires, Date.now(), true);
  if (expires !== undefined) out.expiresAtUnixMs = expires;
  return out;
}

function shown(v: unknown): string {
  if (v === null || v === "") return "-";
  if (Array.isArray(v)) return v.join(",") || "*";
  if (typeof v === "object") return `${(v as { tokens: number }).tokens}/${(v as { period: string }).period}`;
  return String(v);
}

/**
 * A key changed in place: the record as the edge has it, the flags given
 * laid over it, put back under the same id and hash, so its holder keeps
 * the secret. How soon each isolate applies it: docs/edge.md, "Auth and keys".
 */
async function updateKey(client: EdgeSyncClient, id: string, values: Values): Promise<number> {
  const changes = changesOf(values);
  if (Object.keys(changes).length === 0) {
    throw new Error(
      "nothing to change: give one or more of --name --band --default-band --tenant --models --rpm --tpm --budget --max-concurrent --expires",
    );
  }
  const current = (await client.listKeys({})).keys.find((k) => k.id === id);
  if (!current) throw new Error(`no key with id ${id}`);
  if (current.revoked) throw new Error(`key ${id} is revoked; create a new key`);
  const { $typeName: _, ...fields } = current;
  const key = create(ApiKeySchema, { ...fields, ...changes });
  await client.putKey({ key });
  const [before, after] = [keyJson(current), keyJson(key)];
  if (values.json) {
    process.stdout.write(`${JSON.stringify(after)}\n`);
    return 0;
  }
  const lines = (Object.keys(after) as (keyof typeof after)[])
    .filter((k) => JSON.stringify(after[k]) !== JSON.stringify(before[k]))
    .map((k) => `  ${k}: ${shown(before[k])} → ${shown(after[k])}`);
  process.stdout.write(`updated ${id}${lines.length > 0 ? `\n${lines.join("\n")}` : " (no change)"}\n`);
  return 0;
}

function keyState(k: ApiKey, now: number): "revoked" | "expired" | "active" {
  if (k.revoked) return "revoked";
  return expired({ expires_at_unix_ms: Number(k.expiresAtUnixMs) }, now) ? "expired" : "active";
}

async function listKeys(client: EdgeSyncClient, values: Values): Promise<number> {
  const { keys } = await client.listKeys({});
  if (values.json) {
    process.stdout.write(`${JSON.stringify(keys.map(keyJson), null, 2)}\n`);
    return 0;
  }
  const rows = keys.map((k) => [
    k.id,
    k.name,
    k.tenant || "-",
    k.maxBand,
    // Empty: the router's admission.default_band, clamped to the key's highest band.
    k.defaultBand || "router's",
    k.models.join(",") || "*",
    k.rpm ? String(k.rpm) : "-",
    k.tpm ? String(k.tpm) : "-",
    k.budget ? `${k.budget.tokens}/${k.budget.period}` : "-",
    expiresAt(k) ?? "-",
    keyState(k, Date.now()),
  ]);
  process.stdout.write(
    renderTable(
      ["ID", "NAME", "TENANT", "BAND", "DEFAULT BAND", "MODELS", "RPM", "TPM", "BUDGET", "EXPIRES", "STATE"],
      rows,
    ),
  );
  return 0;
}

async function usageKeys(client: EdgeSyncClient, keyId: string, json: boolean): Promise<number> {
  const { usage } = await client.getUsage({ keyId: keyId });
  const rows = usage.map((u) => ({
    id: u.keyId,
    name: u.name,
    requests: Number(u.requests),
    prompt_tokens: Number(u.promptTokens),
    completion_tokens: Number(u.completionTokens),
    total_tokens: Number(u.totalTokens),
    partial_requests: Number(u.partialRequests),
    estimated_requests: Number(u.estimatedRequests),
    estimated_tokens: Number(u.estimatedTokens),
    budget_used: Number(u.budgetUsed),
    budget_tokens: Number(u.budgetTokens),
    revoked: u.revoked,
  }));
  if (json) {
    process.stdout.write(`${JSON.stringify(rows, null, 2)}\n`);
    return 0;
  }
  process.stdout.write(
    renderTable(
      ["ID", "NAME", "REQUESTS", "PROMPT", "COMPLETION", "TOTAL", "PARTIAL", "ESTIMATED", "BUDGET"],
      rows.map((r) => [
        r.id,
        r.name,
        String(r.requests),
        String(r.prompt_tokens),
        String(r.completion_tokens),
        String(r.total_tokens),
        String(r.partial_requests),
        // Requests and tokens the edge estimated: the engine reported no usage for them.
        r.estimated_requests ? `${r.estimated_requests} req, ${r.estimated_tokens} tok` : "-",
        r.budget_tokens ? `${r.budget_used}/${r.budget_tokens}` : "-",
      ]),
    ),
  );
  return 0;
}
