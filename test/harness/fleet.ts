// The tests' name for the loopback fleet, which the benches share.
export * from "../../scripts/fleet.ts";
