/**
 * The few `Reflect` metadata functions tsyringe (a dependency of
 * @peculiar/x509) checks for and calls. A full polyfill package would be one
 * more dependency for four functions over a WeakMap; import this module
 * before `@peculiar/x509` (x509.ts does).
 */
type MetadataMap = Map<unknown, unknown>;
const store = new WeakMap<object, Map<PropertyKey | undefined, MetadataMap>>();

function own(target: object, key: PropertyKey | undefined, create: boolean): MetadataMap | undefined {
  let byKey = store.get(target);
  if (!byKey) {
    if (!create) return undefined;
    byKey = new Map();
    store.set(target, byKey);
  }
  let m = byKey.get(key);
  if (!m && create) {
    m = new Map();
    byKey.set(key, m);
  }
  return m;
}

const R = Reflect as unknown as Record<string, unknown>;
if (typeof R.getMetadata !== "function") {
  const defineMetadata = (k: unknown, v: unknown, target: object, key?: PropertyKey) => {
    own(target, key, true)!.set(k, v);
  };
  const getOwnMetadata = (k: unknown, target: object, key?: PropertyKey) => own(target, key, false)?.get(k);
  const hasOwnMetadata = (k: unknown, target: object, key?: PropertyKey) =>
    own(target, key, false)?.has(k) ?? false;
  const getMetadata = (k: unknown, target: object, key?: PropertyKey): unknown => {
    for (let t: object | null = target; t; t = Object.getPrototypeOf(t)) {
      const m = own(t, key, false);
      if (m?.has(k)) return m.get(k);
    }
    return undefined;
  };
  const hasMetadata = (k: unknown, target: object, key?: PropertyKey) =>
    getMetadata(k, target, key) !== undefined;
  const metadata = (k: unknown, v: unknown) => (target: object, key?: PropertyKey) =>
    defineMetadata(k, v, target, key);
  Object.assign(R, { defineMetadata, getOwnMetadata, hasOwnMetadata, getMetadata, hasMetadata, metadata });
}
