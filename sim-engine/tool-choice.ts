/**
 * Whether a chat request's answer is a tool call, and to which function.
 * A model decides this from the conversation; the sim decides it by a rule
 * a test can rely on (docs/sim-engine.md):
 *
 * - `none`, or no tools: never;
 * - a named function (`{"type":"function","function":{"name":…}}`): that one;
 * - `auto`: when the last message is the user's and mentions a tool's
 *   function name (case-insensitive), the first such tool in `tools` order;
 *   otherwise a text answer. So a conversation that has just returned a
 *   tool's result (last message `tool`) is answered in text, not looped;
 * - `required`: the one `auto` would call, else the first tool.
 */

export interface ToolFunction {
  name: string;
  parameters?: Record<string, unknown> | null | undefined;
}

export type ToolChoice = "none" | "auto" | "required" | { type: "function"; function: { name: string } };

export interface LastMessage {
  role: string;
  text: string;
}

export function toolToCall(
  tools: readonly ToolFunction[],
  choice: ToolChoice,
  last: LastMessage | undefined,
): ToolFunction | undefined {
  if (tools.length === 0 || choice === "none") return undefined;
  if (typeof choice === "object") return tools.find((t) => t.name === choice.function.name);
  const said = last?.role === "user" ? last.text.toLowerCase() : "";
  const mentioned = said ? tools.find((t) => said.includes(t.name.toLowerCase())) : undefined;
  if (choice === "auto") return mentioned;
  return mentioned ?? tools[0];
}
