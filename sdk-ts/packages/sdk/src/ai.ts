/**
 * The Vercel AI SDK (`ai`): `durableTool()` makes a tool's `execute` an effect. Each call the
 * model asks for records its intent first, runs the tool only on `proceed`, keeps the result
 * with the receipt and answers a call done before with that result, without running the tool.
 *
 *     import { durableTools, run } from "@tallybook/sdk/ai";
 *     const tools = durableTools({ refund }, { refund: { kind: "payment", target: "stripe" } });
 *     await run({ workflow: "support", runId: ticket.id }, () => generateText({ model, tools, … }));
 *
 * The key. The AI SDK's `toolCallId` comes from the model's response: a run restarted after a
 * crash asks the model again and gets a new id for the same call, so the id cannot be the key
 * (it is recorded as the intent's tool call all the same). The key is the tool's name, the
 * run and a fingerprint of the arguments, so the restarted run's call is the same effect; or a
 * template of the arguments (`key: "refund:{order}"`) or a function of them. The run is the
 * `run(...)` (or `tb.run(...)`) around the agent; without one and without a key of its own the call is refused
 * before anything happens, since the arguments alone would make two conversations' calls one
 * effect.
 *
 * What the model is told. A tool's thrown error is the AI SDK's `tool-error` part, which the
 * model reads: a call that must not run (`wait`, `denied`, `conflict`, intent not recorded)
 * throws its interruption report (the decision, the reason, the case and its URL), so the model
 * learns it was not performed and why, and the application finds it among the steps' errors
 * (`EffectInDoubt` and the others are `EffectInterrupted`).
 */

import {
  checkEffect,
  evidence,
  type ReceiptFields,
  replayed,
  run,
  Tallybook,
  TOOL_OPTIONS,
  type ToolOptions,
  toolKey,
} from "./client.js";
import { TallybookError } from "./errors.js";
import { fingerprint, type Json, KEY_FINGERPRINT } from "./records.js";
import * as scope from "./scope.js";

export { run };

/** The AI SDK tool's part we wrap: `execute(input, { toolCallId, … })`. */
export interface ExecutableTool {
  // biome-ignore lint/suspicious/noExplicitAny: the AI SDK's tools type their own input
  execute?: (input: any, options: any) => unknown;
}

export interface DurableToolOptions extends Partial<ToolOptions> {
  /** The tool's name (its key in `tools`): the default target, and part of the default key. */
  name: string;
  /** A template of the arguments ("refund:{order}", may name {runId}) or a function of them. */
  key?: string | ((input: Json) => string);
  /** The result's field holding the provider's id, or a function of the result; else the call. */
  receipt?: string | ((result: unknown) => ReceiptFields);
  /** The client; else one made from TALLYBOOK_URL and TALLYBOOK_API_KEY at the first call. */
  tb?: Tallybook;
}

let shared: Tallybook | null = null;

function client(given: Tallybook | undefined): Tallybook {
  if (given) return given;
  shared ??= new Tallybook();
  return shared;
}

/** The default key: the tool, the run, and the arguments' fingerprint. */
function defaultKey(name: string, input: unknown): string {
  const run = scope.currentRun();
  if (run === null) {
    throw new TallybookError(
      `The call of ${name} has no run: open run({ workflow, runId }, …) around the agent, or give the ` +
        'tool a key of its own arguments (key: "refund:{order}"). It was not performed.',
    );
  }
  return `${name}:${run}:${fingerprint(input).slice(0, KEY_FINGERPRINT)}`;
}

/** The input's field names when the tool's schema says them (a zod object, `jsonSchema()`). */
function inputFields(schema: unknown): string[] | null {
  if (!schema || typeof schema !== "object") return null;
  const shape = (schema as Json).shape;
  if (shape && typeof shape === "object") return Object.keys(shape);
  const json = "jsonSchema" in schema ? (schema as Json).jsonSchema : null;
  if (
    json &&
    typeof json === "object" &&
    json.type === "object" &&
    json.properties &&
    typeof json.properties === "object"
  ) {
    return Object.keys(json.properties);
  }
  return null;
}

/** The tool, with its `execute` made an effect (the tool is not changed: a copy is returned). */
export function durableTool<T extends ExecutableTool>(tool: T, options: DurableToolOptions): T {
  const execute = tool.execute;
  if (typeof execute !== "function") {
    throw new TypeError(`${options.name} has no execute: a tool the client runs elsewhere is no effect here`);
  }
  checkEffect(options, `durableTool ${options.name}`, {
    known: [...TOOL_OPTIONS, "name", "key", "receipt", "tb"],
    params: inputFields((tool as { inputSchema?: unknown }).inputSchema),
    receipt: "field or function",
  });
  const { name, key, receipt, tb, ...declared } = options;
  const effect: ToolOptions = { kind: "tool", target: name, ...declared };
  const wrapped = async (input: Json, callOptions: { toolCallId: string }) => {
    const keyed = key === undefined ? defaultKey(name, input) : toolKey(key, input);
    return client(tb).effect(keyed, { ...effect, request: input, toolCallId: callOptions.toolCallId }, async (fx) => {
      if (fx.completed) return replayed(fx.stored, true);
      const result = await execute.call(tool, input, callOptions);
      if (result !== null && typeof result === "object" && Symbol.asyncIterator in result) {
        // Nothing ran: a generator's body runs only when it is iterated.
        fx.fail("a streaming tool", { definitive: true });
        throw new TypeError(`${name} streams its result; durableTool takes tools that return one`);
      }
      const from = receipt ?? (() => ({ system: effect.target, externalId: callOptions.toolCallId }));
      const [fields, problem] = evidence(result, from, effect.target);
      fx.receipt(fields);
      if (problem !== null) throw problem;
      return result;
    });
  };
  return { ...tool, execute: wrapped };
}

/** Every tool of a tool set made durable, declared by name (`{ refund: { kind: "payment" } }`). */
export function durableTools<S extends Record<string, ExecutableTool>>(
  tools: S,
  declared: { [K in keyof S]?: Omit<DurableToolOptions, "name"> | null } = {},
  tb?: Tallybook,
): S {
  const wrapped: Record<string, ExecutableTool> = {};
  for (const [name, tool] of Object.entries(tools)) {
    const options = declared[name as keyof S];
    wrapped[name] =
      options === null || typeof tool.execute !== "function"
        ? tool
        : durableTool(tool, { tb, ...options, name } as DurableToolOptions);
  }
  return wrapped as S;
}
