/**
 * The messages a request's prompt is made of, for the estimates that read
 * it (demand.ts, prefix-hash.ts): chat's `messages`, or what a Responses
 * API request says the same way, its `instructions` first (as the system
 * message engines render them as) and then its `input`, a string (one user
 * message) or a list of message items. Items that are not messages (a
 * function call's output, say) carry their text under `output`, which
 * counts too. Pure, read as far as the body is well-formed.
 */
export interface PromptMessage {
  role: unknown;
  content: unknown;
}

export function messagesOf(body: Readonly<Record<string, unknown>>): readonly PromptMessage[] | undefined {
  if (Array.isArray(body.messages)) return body.messages as PromptMessage[];
  if (body.input === undefined || !("instructions" in body || isItemList(body.input))) return undefined;
  const out: PromptMessage[] = [];
  if (typeof body.instructions === "string") out.push({ role: "system", content: body.instructions });
  if (typeof body.input === "string") out.push({ role: "user", content: body.input });
  else if (Array.isArray(body.input)) {
    for (const item of body.input as Record<string, unknown>[]) {
      if (typeof item !== "object" || item === null) continue;
      out.push({ role: item.role ?? item.type, content: item.content ?? item.output ?? item.arguments });
    }
  }
  return out;
}

/** A Responses input list: objects, where an embedding's input is strings or token ids. */
function isItemList(input: unknown): boolean {
  return Array.isArray(input) && input.length > 0 && typeof input[0] === "object" && input[0] !== null;
}
