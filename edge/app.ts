import { Hono } from "hono";
import { cors } from "./cors.ts";
import type { Env } from "./env.ts";
import { inference } from "./inference.ts";
import { listModels, retrieveModel } from "./models.ts";
import { ApiError, errors } from "./openai-errors.ts";
import { chatRequest, completionRequest, embeddingRequest, responsesRequest } from "./request-schema.ts";
import { EDGESYNC_PREFIX, handleEdgeSync } from "./sync/service.ts";
import { newRequestId, unhandledError } from "./unhandled.ts";

/**
 * The Worker's routes: the OpenAI surface (inference.ts has the request
 * path, step by step), the model list, a health check, and EdgeSync for
 * the control plane.
 */
export const app = new Hono<{ Bindings: Env }>();

app.onError((err) => {
  if (err instanceof ApiError) return err.toResponse();
  return unhandledError(err, newRequestId());
});

app.notFound(() =>
  errors
    .notFound(
      "Unknown path. This gateway serves /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings, /v1/models and /v1/models/{model}.",
    )
    .toResponse(),
);

app.get("/healthz", (c) => c.json({ status: "ok" }));

app.all(`${EDGESYNC_PREFIX}*`, (c) => handleEdgeSync(c.req.raw, c.env));

// Before every /v1 route, so errors and unknown paths carry the headers a page needs to read them.
app.use("/v1/*", cors);

app.get("/v1/models", listModels);
app.get("/v1/models/:model{.+}", retrieveModel);

app.post("/v1/chat/completions", inference("/v1/chat/completions", chatRequest));
app.post("/v1/completions", inference("/v1/completions", completionRequest));
app.post("/v1/responses", inference("/v1/responses", responsesRequest));
app.post("/v1/embeddings", inference("/v1/embeddings", embeddingRequest));
for (const path of ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"]) {
  app.all(path, () => errors.methodNotAllowed(`${path} accepts POST only.`).toResponse({ allow: "POST" }));
}
// A stored response lives on the engine that made it, which nothing here can name again.
app.all("/v1/responses/:rest{.+}", () =>
  errors
    .notFound(
      "This gateway keeps no responses: /v1/responses/{id} (retrieve, delete, cancel, input items) is not served. Send the conversation in `input` instead.",
    )
    .toResponse(),
);
app.all("/v1/models", () =>
  errors.methodNotAllowed("/v1/models accepts GET only.").toResponse({ allow: "GET" }),
);
app.all("/v1/models/:model{.+}", () =>
  errors.methodNotAllowed("/v1/models/{model} accepts GET only.").toResponse({ allow: "GET" }),
);
