/**
 * Replica ids: `<model>/<profile>/<n>`. Stable across restarts of the
 * replica (a restart bumps the generation, not the id), so logs, metrics and
 * the edge's endpoint ids keep meaning the same slot. Model names may contain
 * "/" (Hugging Face style); profile names may not, so parsing splits from
 * the right.
 */
export interface ReplicaKey {
  model: string;
  profile: string;
  index: number;
}

export function replicaId(model: string, profile: string, index: number): string {
  return `${model}/${profile}/${index}`;
}

export function parseReplicaId(id: string): ReplicaKey | undefined {
  const last = id.lastIndexOf("/");
  if (last <= 0) return undefined;
  const mid = id.lastIndexOf("/", last - 1);
  if (mid <= 0) return undefined;
  const n = id.slice(last + 1);
  if (!/^\d+$/.test(n)) return undefined;
  return { model: id.slice(0, mid), profile: id.slice(mid + 1, last), index: Number(n) };
}
