import { describe, expect, it } from "vitest";
import { sumCharges } from "./charge.ts";

describe("sumCharges", () => {
  it("sums a batch and counts partial answers and estimated ones", () => {
    const c = (p: number, k: number, partial = false, estimated = false) => ({
      prompt_tokens: p,
      completion_tokens: k,
      partial,
      estimated,
    });
    expect(sumCharges("b1", [c(10, 5), c(7, 2, true, true), c(-3, 1.7, false, true)])).toEqual({
      id: "b1",
      requests: 3,
      prompt_tokens: 17,
      completion_tokens: 8,
      partial_requests: 1,
      estimated_requests: 2,
      estimated_tokens: 10,
      closes: [],
    });
  });
  it("names the reservations its requests held", () => {
    const c = (reservation?: string) => ({
      prompt_tokens: 1,
      completion_tokens: 1,
      partial: false,
      reservation,
    });
    expect(sumCharges("b2", [c("req_a"), c(), c("req_b")]).closes).toEqual(["req_a", "req_b"]);
  });
});
