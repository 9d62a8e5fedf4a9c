// The tests' name for the process harness, which the benches and scripts share.
export * from "../../common/free-ports.ts";
export * from "../../common/processes.ts";
