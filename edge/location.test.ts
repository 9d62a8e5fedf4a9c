import { describe, expect, it } from "vitest";
import { requestLocation } from "./location.ts";
import { ApiError } from "./openai-errors.ts";

const req = (headers: Record<string, string>, cf?: unknown) => {
  const r = new Request("http://edge/v1/chat/completions", { headers });
  if (cf !== undefined) Object.defineProperty(r, "cf", { value: cf });
  return r;
};
const texas = { continent: "NA", country: "US", colo: "DFW", city: "Austin" };

describe("a request's location", () => {
  it("is request.cf's continent, country and colo, and the header means nothing unless the Worker enables it", () => {
    expect(requestLocation(req({ "x-llmgw-location": "EU" }, texas), undefined)).toEqual({
      continent: "NA",
      country: "US",
      colo: "DFW",
    });
    expect(requestLocation(req({}), undefined)).toBeUndefined();
    expect(requestLocation(req({}, { asn: 1 }), undefined)).toBeUndefined();
  });

  it("with LLMGW_LOCATION_HEADER=1 is the header's alone: continent, country, colo; none without it", () => {
    expect(requestLocation(req({ "x-llmgw-location": "EU/DE/FRA" }, texas), "1")).toEqual({
      continent: "EU",
      country: "DE",
      colo: "FRA",
    });
    expect(requestLocation(req({ "x-llmgw-location": "EU" }, texas), "1")).toEqual({
      continent: "EU",
      country: undefined,
      colo: undefined,
    });
    // Miniflare's cf is the machine's, not the client's: without the header, no location.
    expect(requestLocation(req({}, texas), "1")).toBeUndefined();
    const bad = () => requestLocation(req({ "x-llmgw-location": "Europe" }), "1");
    expect(bad).toThrow(ApiError);
    expect(bad).toThrow("x-llmgw-location: continent[/country[/colo]], as EU, EU/DE or EU/DE/FRA");
  });
});
