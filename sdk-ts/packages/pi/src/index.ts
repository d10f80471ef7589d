/**
 * `@tallybook/pi`: a Pi extension that makes the tool calls you declare durable effects.
 *
 *     // .pi/extensions/tallybook.ts
 *     import { tallybook } from "@tallybook/pi";
 *     export default tallybook({ effects: [{ tool: "bash", match: /\bgit push\b/, kind: "deploy", target: "git" }] });
 *
 * Before a declared call runs (`tool_call`), its intent is recorded; the call runs only on
 * `proceed`. On `completed` it is blocked with what was already done (the receipt and the
 * result kept with it), so the model does not repeat it; on `wait`, `denied` or `conflict`
 * (and when the intent cannot be recorded) it is blocked with the reason and the case to
 * settle, with its URL. The result (`tool_result`) is the receipt: the call's id, unless the
 * declaration takes the provider's id from it; an error result is reported as a failure whose
 * outcome nobody knows (or, declared `definitiveOnError`, as a definitive one).
 *
 * Pi's session id is the run and the tool call id is the call; the run is said `running` at its
 * first effect and `ok` when the session ends (`session_shutdown`), as the Python SDK's runs are. The key is the tool's name, the
 * run and a fingerprint of the input: the same call asked again in the session (after a crash,
 * Pi resumes the session and the model asks anew, with a new tool call id) is the same effect.
 * A declaration may give a key of its own, a template of the input ("deploy:{command}") or a
 * function of it, which makes the effect one across sessions.
 */

import type { ExtensionAPI, ExtensionContext, ExtensionFactory } from "@earendil-works/pi-coding-agent";
import {
  checkEffect,
  type Effect,
  EffectInterrupted,
  fingerprint,
  type Json,
  KEY_FINGERPRINT,
  type ReceiptFields,
  Tallybook,
  TOOL_OPTIONS,
  type ToolOptions,
} from "@tallybook/sdk";

export interface PiEffect extends Partial<ToolOptions> {
  /** The tool's name: a built-in one ("bash", "write") or one another extension registers. */
  tool: string;
  /** Which calls are effects: a pattern over the input (the command, for bash), or a test. */
  match?: RegExp | ((input: Json) => boolean);
  /** A template of the input's fields ("deploy:{command}", may name {runId}) or a function. */
  key?: string | ((input: Json) => string);
  /** The provider's id from the result's text; else the receipt names the tool call. */
  receipt?: (result: { text: string; details: unknown }) => ReceiptFields | null;
  /** An error result means the effect did not happen (a retry is safe). */
  definitiveOnError?: boolean;
}

export interface TallybookPiOptions {
  effects: PiEffect[];
  /** The client; else one made from TALLYBOOK_URL and TALLYBOOK_API_KEY at the first call. */
  tb?: Tallybook;
  /** The run: Pi's session id unless told (a ticket, a CI job). */
  run?: (ctx: ExtensionContext) => string;
}

interface Pending {
  result(outcome: { text: string; details: unknown; isError: boolean } | null): void;
  done: Promise<unknown>;
}

/** The text of a tool result's content. */
function textOf(content: unknown): string {
  if (!Array.isArray(content)) return "";
  return content
    .filter((part): part is { type: "text"; text: string } => part?.type === "text")
    .map((part) => part.text)
    .join("\n");
}

function subject(input: Json): string {
  return typeof input.command === "string" ? input.command : JSON.stringify(input);
}

/** The input fields of Pi's built-in tools, which a key template may name. */
const BUILT_IN: Record<string, string[]> = {
  bash: ["command", "timeout"],
  write: ["path", "content"],
};

function keyOf(declared: PiEffect, input: Json, run: string): string {
  const { key } = declared;
  if (typeof key === "function") return key(input);
  if (typeof key === "string") {
    return key.replace(/\{([^{}]+)\}/g, (_, name: string) => {
      const value = name === "runId" ? run : input[name];
      if (value === undefined) throw new TypeError(`the key ${key} names ${name}, which the input lacks`);
      return typeof value === "object" ? JSON.stringify(value) : String(value);
    });
  }
  return `${declared.tool}:${run}:${fingerprint(input).slice(0, KEY_FINGERPRINT)}`;
}

/** What the model reads instead of the call: the interruption report, in the SDK's words. */
function blocked(report: EffectInterrupted): string {
  return `Not performed (Tallybook): ${report.message}`;
}

function alreadyDone(fx: Effect): string {
  const stored = fx.stored;
  const data = stored?.data as Json | null | undefined;
  const result = data && typeof data === "object" && "result" in data ? `\nIts result then:\n${data.result}` : "";
  const receipt = stored ? ` (receipt ${stored.system}:${stored.externalId})` : "";
  return (
    `Already done (Tallybook): ${fx.key} was performed before${receipt}. Do not repeat it; ` +
    `carry on from its result.${result}`
  );
}

/** The extension: `export default tallybook({ effects: [...] })` in a Pi extension file. */
export function tallybook(options: TallybookPiOptions): ExtensionFactory {
  if (!Array.isArray(options?.effects)) throw new TypeError("tallybook({ effects }): effects must be a list");
  options.effects.forEach((declared, i) => {
    const where = `effects[${i}]${typeof declared?.tool === "string" ? ` (${declared.tool})` : ""}`;
    if (typeof declared?.tool !== "string" || !declared.tool)
      throw new TypeError(`${where}: tool must be the tool's name`);
    const { match } = declared;
    if (match !== undefined && !(match instanceof RegExp) && typeof match !== "function") {
      throw new TypeError(`${where}: match must be a RegExp over the input or a test of it`);
    }
    if (declared.definitiveOnError !== undefined && typeof declared.definitiveOnError !== "boolean") {
      throw new TypeError(`${where}: definitiveOnError must be true or false`);
    }
    // Pi's built-in tools say their input; others' are not known until they are called.
    checkEffect(declared, where, {
      known: [...TOOL_OPTIONS, "tool", "match", "key", "receipt", "definitiveOnError"],
      params: BUILT_IN[declared.tool] ?? null,
      receipt: "function",
    });
  });
  let shared: Tallybook | undefined = options.tb;
  const client = () => {
    shared ??= new Tallybook();
    return shared;
  };
  return (pi: ExtensionAPI) => {
    const pending = new Map<string, Pending>();
    // The runs this session's effects belong to: `running` at the first effect, `ok` at the end.
    const runs = new Set<string>();

    pi.on("tool_call", async (event, ctx) => {
      const input = event.input as Json;
      const declared = options.effects.find(
        (e) =>
          e.tool === event.toolName &&
          (e.match === undefined || (typeof e.match === "function" ? e.match(input) : e.match.test(subject(input)))),
      );
      if (declared === undefined) return undefined;
      const run = options.run ? options.run(ctx) : ctx.sessionManager.getSessionId();
      const { tool, match, key, receipt, definitiveOnError, ...effect } = declared;
      const tb = client();
      if (!runs.has(run)) {
        runs.add(run);
        tb.runEvent(run, "running", { workflow: "pi", agent: "pi" });
      }
      let decided!: (fx: Effect | EffectInterrupted) => void;
      const decision = new Promise<Effect | EffectInterrupted>((resolve) => {
        decided = resolve;
      });
      let settle!: (outcome: { text: string; details: unknown; isError: boolean } | null) => void;
      const outcome = new Promise<{ text: string; details: unknown; isError: boolean } | null>((resolve) => {
        settle = resolve;
      });
      const done = tb
        .run({ workflow: "pi", runId: run }, async () =>
          tb.effect(
            keyOf(declared, input, run),
            { kind: "tool", target: tool, ...effect, request: input, toolCallId: event.toolCallId },
            async (fx) => {
              decided(fx);
              if (fx.completed) return;
              const result = await outcome;
              if (result === null) {
                fx.fail("the call ended without a result", { definitive: false });
              } else if (result.isError) {
                fx.fail(result.text || "the tool failed", { definitive: definitiveOnError ?? false });
              } else {
                const made = receipt?.(result) ?? { system: effect.target ?? tool, externalId: event.toolCallId };
                fx.receipt({ ...made, data: { ...(made.data ? { data: made.data } : {}), result: result.text } });
              }
            },
          ),
        )
        .catch((error: unknown) => {
          if (error instanceof EffectInterrupted) decided(error);
          else decided(new EffectInterrupted(event.toolCallId, "error", String(error), null, null));
        });
      const fx = await decision;
      if (fx instanceof EffectInterrupted) return { block: true, reason: blocked(fx) };
      if (fx.completed) return { block: true, reason: alreadyDone(fx) };
      pending.set(event.toolCallId, { result: settle, done });
      return undefined;
    });

    pi.on("tool_result", async (event) => {
      const call = pending.get(event.toolCallId);
      if (call === undefined) return undefined;
      pending.delete(event.toolCallId);
      call.result({ text: textOf(event.content), details: event.details, isError: event.isError });
      await call.done;
      return undefined;
    });

    // A call that ended without a result (aborted, or blocked by a later extension): nobody
    // knows whether it did anything, so it is reported as such.
    pi.on("tool_execution_end", async (event) => {
      const call = pending.get(event.toolCallId);
      if (call === undefined) return;
      pending.delete(event.toolCallId);
      call.result(null);
      await call.done;
    });

    // The session ends (Pi quits, reloads, or replaces it with a new, resumed or forked one,
    // whose runtime calls this factory again): its runs end, as Python's do, and what it spooled
    // is delivered. A client the extension made is closed and made afresh by the next session;
    // one given as `tb` is the caller's to close.
    pi.on("session_shutdown", async () => {
      const tb = shared;
      if (tb === undefined) return;
      for (const run of runs) tb.runEvent(run, "ok", { workflow: "pi", agent: "pi" });
      runs.clear();
      if (tb === options.tb) {
        await tb.flush();
        return;
      }
      shared = undefined;
      await tb.close();
    });
  };
}
