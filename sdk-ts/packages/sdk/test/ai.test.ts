/**
 * `durableTool` with the AI SDK's own mock language model (`ai/test`): the model asks for a
 * refund, the tool is an effect, and what Tallybook decides is what the model is told. On the
 * fake, and on the live server when pytest gives one.
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { describe, test } from "node:test";
import { generateText, stepCountIs, tool } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { z } from "zod";
import { type DurableToolOptions, durableTool, durableTools, run } from "../src/ai.js";
import type { Json } from "../src/index.js";
import { backends } from "./backends.js";

const usage = {
  inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 5, text: 5, reasoning: undefined },
};

/** A model that asks for `refund(order)` once, then answers with text. */
function model(callId: string, order: number) {
  return new MockLanguageModelV4({
    doGenerate: [
      {
        content: [{ type: "tool-call", toolCallId: callId, toolName: "refund", input: JSON.stringify({ order }) }],
        finishReason: { unified: "tool-calls", raw: undefined },
        usage,
        warnings: [],
      },
      {
        content: [{ type: "text", text: "Done." }],
        finishReason: { unified: "stop", raw: undefined },
        usage,
        warnings: [],
      },
    ],
  });
}

/** What the model was told about the tool call, in its second request. */
function toldAbout(m: MockLanguageModelV4): string {
  return JSON.stringify(m.doGenerateCalls[1]?.prompt.filter((message) => message.role === "tool"));
}

let n = 0;

for (const make of backends()) {
  describe(`durableTool on the ${make.name}`, () => {
    function agent() {
      const b = make();
      const refunds: number[] = [];
      const refund = durableTool(
        tool({
          description: "Refund an order in full.",
          inputSchema: z.object({ order: z.number() }),
          execute: async ({ order }) => {
            refunds.push(order);
            return { id: `re_${order}`, amount: 1250 };
          },
        }),
        { name: "refund", kind: "payment", target: "fakepay", receipt: "id", tb: b.tb },
      );
      const ask = (runId: string, callId: string, order: number) => {
        const m = model(callId, order);
        const run = b.tb.run({ workflow: "support", runId }, () =>
          generateText({ model: m, tools: { refund }, prompt: "Refund my order", stopWhen: stepCountIs(3) }),
        );
        return run.then((result) => ({ result, told: toldAbout(m) }));
      };
      return { b, refunds, ask };
    }

    test("the model's call is an effect with its receipt, and asked again in the run it is not repeated", async () => {
      const { b, refunds, ask } = agent();
      const run = `ticket-${make.name}-${n++}`;
      try {
        const first = await ask(run, "call-1", 42);
        assert.equal(first.result.text, "Done.");
        assert.deepEqual(refunds, [42]);
        assert.ok(await b.tb.flush());
        const status = await b.tb.status(keyFor(run, { order: 42 }));
        assert.equal(status.state, "succeeded");
        assert.deepEqual(status.receipts[0]?.data, { result: { id: "re_42", amount: 1250 } });
        // The run restarted: the model is asked again and its call has a new id.
        const again = await ask(run, "call-2", 42);
        assert.deepEqual(refunds, [42]);
        assert.ok(again.told.includes('"re_42"'), again.told);
        assert.deepEqual(again.result.steps[0]?.toolResults[0]?.output, { id: "re_42", amount: 1250 });
      } finally {
        await b.close();
      }
    });

    test("a call in doubt is not performed, and the model is told the case to settle", async () => {
      const { b, refunds, ask } = agent();
      const run = `ticket-${make.name}-${n++}`;
      const crashing = durableTool(
        tool({
          inputSchema: z.object({ order: z.number() }),
          execute: async (): Promise<{ id: string }> => {
            throw new Error("the provider hung up");
          },
        }),
        { name: "refund", kind: "payment", target: "fakepay", receipt: "id", tb: b.tb },
      );
      try {
        const m = model("call-1", 7);
        await b.tb.run({ workflow: "support", runId: run }, () =>
          generateText({ model: m, tools: { refund: crashing }, prompt: "Refund", stopWhen: stepCountIs(3) }),
        );
        assert.ok(await b.tb.flush());
        const { result, told } = await ask(run, "call-2", 7);
        assert.deepEqual(refunds, []);
        const error = result.steps[0]?.content.find((part) => part.type === "tool-error");
        assert.equal((error?.error as Error | undefined)?.name, "EffectInDoubt");
        assert.ok(told.includes("uncertain") && told.includes("/cases/"), told);
      } finally {
        await b.close();
      }
    });

    test("an abandoned effect is denied, and the denial's reason reaches the model", async () => {
      const { b, refunds, ask } = agent();
      const run = `ticket-${make.name}-${n++}`;
      try {
        await ask(run, "call-1", 9);
        assert.ok(await b.tb.flush());
        await b.operator(keyFor(run, { order: 9 }), "abandon");
        const denied = await ask(run, "call-2", 9);
        assert.deepEqual(refunds, [9]);
        assert.ok(denied.told.includes("denied"), denied.told);
      } finally {
        await b.close();
      }
    });

    test("three lines: durableTools declares the effects by name, run() names the run", async () => {
      const b = make();
      const sent: string[] = [];
      const sendEmail = tool({
        inputSchema: z.object({ to: z.string() }),
        execute: async ({ to }) => {
          sent.push(to);
          return "queued";
        },
      });
      const lookup = tool({ inputSchema: z.object({ to: z.string() }), execute: async () => "found" });
      const tools = durableTools({ sendEmail, lookup }, { sendEmail: { kind: "email" }, lookup: null }, b.tb);
      assert.equal(tools.lookup, lookup);
      const ask = (callId: string) =>
        run({ workflow: "mailer", runId: `mail-${make.name}-${n}` }, () =>
          generateText({
            model: new MockLanguageModelV4({
              doGenerate: [
                {
                  content: [
                    { type: "tool-call", toolCallId: callId, toolName: "sendEmail", input: '{"to":"ann@example.com"}' },
                  ],
                  finishReason: { unified: "tool-calls", raw: undefined },
                  usage,
                  warnings: [],
                },
                {
                  content: [{ type: "text", text: "Sent." }],
                  finishReason: { unified: "stop", raw: undefined },
                  usage,
                  warnings: [],
                },
              ],
            }),
            tools,
            prompt: "Mail Ann",
            stopWhen: stepCountIs(3),
          }),
        );
      try {
        await ask("call-1");
        assert.ok(await b.tb.flush());
        const again = await ask("call-2");
        assert.deepEqual(sent, ["ann@example.com"]);
        assert.equal(again.steps[0]?.toolResults[0]?.output, "queued");
      } finally {
        n++;
        await b.close();
      }
    });

    test("a tool that streams its result is refused, and reported as not performed", async () => {
      const b = make();
      const streaming = durableTool(
        tool({
          inputSchema: z.object({ order: z.number() }),
          async *execute({ order }) {
            yield `refunding ${order}`;
          },
        }),
        { name: "refund", kind: "payment", key: `stream:${make.name}:${n}:{order}`, tb: b.tb },
      );
      try {
        const m = model("call-1", 5);
        await generateText({ model: m, tools: { refund: streaming }, prompt: "Refund", stopWhen: stepCountIs(3) });
        assert.ok(toldAbout(m).includes("streams its result"), toldAbout(m));
        assert.ok(await b.tb.flush());
        assert.equal((await b.tb.status(`stream:${make.name}:${n}:5`)).state, "failed");
      } finally {
        n++;
        await b.close();
      }
    });

    test("without a run or a key of its own, a call is refused before anything happens", async () => {
      const { b, refunds } = agent();
      const refund = durableTool(
        tool({ inputSchema: z.object({ order: z.number() }), execute: async () => ({ id: "x" }) }),
        { name: "refund", tb: b.tb },
      );
      try {
        const m = model("call-1", 1);
        await generateText({ model: m, tools: { refund }, prompt: "Refund", stopWhen: stepCountIs(3) });
        assert.ok(toldAbout(m).includes("has no run"), toldAbout(m));
        assert.deepEqual(refunds, []);
      } finally {
        await b.close();
      }
    });
  });
}

/** The default key: the tool, the run and the arguments' fingerprint. */
function keyFor(run: string, input: unknown): string {
  return `refund:${run}:${createHash("sha256").update(JSON.stringify(input)).digest("hex").slice(0, 32)}`;
}

test("a durableTool declaration is checked when it is made: each mistake names the tool and the field", () => {
  const refund = tool({ inputSchema: z.object({ order: z.number() }), execute: async () => ({ id: "re_1" }) });
  const mistakes: Array<[Json, RegExp]> = [
    [{ replay: "sometimes" }, /durableTool refund: replay "sometimes" must be one of never, safe/],
    [{ key: "refund:{orderId}" }, /durableTool refund: key .* names orderId, which the tool's input does not have/],
    [{ key: "refund:{}" }, /durableTool refund: key .* names an empty field/],
    [{ key: 42 }, /durableTool refund: key 42 must be a template/],
    [{ receipt: 7 }, /durableTool refund: receipt 7 must be the result's field/],
    [{ receipt: "" }, /durableTool refund: receipt "" must be/],
    [{ kind: "" }, /durableTool refund: kind "" must be a non-empty string/],
    [{ waitInDoubtMs: "5s" }, /durableTool refund: waitInDoubtMs "5s" must be a positive number/],
    [{ definitiveOn: ["TypeError"] }, /durableTool refund: definitiveOn .* must be a list of error classes/],
    [{ recipt: "id" }, /durableTool refund: unknown option\(s\) recipt/],
  ];
  for (const [options, told] of mistakes) {
    assert.throws(() => durableTool(refund, { name: "refund", ...options } as DurableToolOptions), told);
    assert.throws(() => durableTool(refund, { name: "refund", ...options } as DurableToolOptions), TypeError);
  }
  // Right: a template of the schema's fields or of the run, a field or a function receipt.
  durableTool(refund, { name: "refund", key: "refund:{order}:{runId}", receipt: "id", replay: "reconcile" });
  durableTool(refund, { name: "refund", receipt: (r: unknown) => ({ system: "s", externalId: String(r) }) });
  // A schema that does not say its fields (a function of the input): the template is not refused.
  durableTool({ execute: async () => 1 }, { name: "other", key: "other:{anything}" });
});
