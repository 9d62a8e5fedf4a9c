/**
 * The chat request a Responses API request stands for, for the estimates
 * that read chat's fields (demand.ts, prefix-hash.ts, the key's reservation):
 * its `instructions` first, as the system message engines render them as,
 * then its `input`, a string (one user message) or a list of items, and
 * `max_output_tokens` as `max_tokens`. Chat's own `max_tokens` or `n` in a
 * Responses body mean nothing to an engine and count for nothing here, and
 * a conversation hashes the same whether its first turn came as a string
 * or as an item. Pure, read as far as the body is well-formed.
 */
export interface ChatView extends Record<string, unknown> {
  messages: { role: string; content: unknown }[];
}

export function chatViewOf(body: Readonly<Record<string, unknown>>): ChatView {
  const messages: ChatView["messages"] = [];
  if (typeof body.instructions === "string") messages.push({ role: "system", content: body.instructions });
  if (typeof body.input === "string") messages.push({ role: "user", content: body.input });
  else if (Array.isArray(body.input)) {
    for (const item of body.input as unknown[]) {
      if (typeof item === "object" && item !== null)
        messages.push(itemMessage(item as Record<string, unknown>));
    }
  }
  const view: ChatView = { messages };
  if (body.max_output_tokens !== undefined) view.max_tokens = body.max_output_tokens;
  if (body.stream !== undefined) view.stream = body.stream;
  if (body.cache_salt !== undefined) view.cache_salt = body.cache_salt;
  return view;
}

/**
 * An input item as a message: a message keeps its role and content; any
 * other item (a function call, its output, a reasoning summary replayed)
 * is text the engine renders into the prompt too, so its text fields count.
 */
function itemMessage(item: Record<string, unknown>): ChatView["messages"][number] {
  if (typeof item.role === "string") return { role: item.role, content: item.content };
  const parts: string[] = [];
  for (const key of ["name", "arguments", "output", "encrypted_content"]) {
    if (typeof item[key] === "string") parts.push(item[key] as string);
  }
  for (const key of ["summary", "content"]) {
    if (!Array.isArray(item[key])) continue;
    for (const part of item[key] as { text?: unknown }[])
      if (typeof part?.text === "string") parts.push(part.text);
  }
  return { role: typeof item.type === "string" ? item.type : "item", content: parts.join("\n") };
}
