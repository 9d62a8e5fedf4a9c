/** Plain doubling without jitter, for restarts of one process where lockstep is not a concern. */
export function doublingDelay(failures: number, baseMs: number, maxMs: number): number {
  if (failures <= 0) return 0;
  return Math.min(maxMs, baseMs * 2 ** (failures - 1));
}
