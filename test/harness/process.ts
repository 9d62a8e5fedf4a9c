// The tests' name for the process harness, which the benches and scripts share.
export * from "../../common/processes.ts";
