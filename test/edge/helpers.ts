// The edge tests' name for the edge harness, which the benches share.
export * from "../../scripts/edge-harness.ts";
