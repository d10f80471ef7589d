/** With `@opentelemetry/api` installed, intents and receipts carry the current span's ids. */

import assert from "node:assert/strict";
import { test } from "node:test";
import { context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { FakeTallybook } from "../src/testing.js";

test("the span current where the effect runs names its trace and span", async () => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  const span = trace.wrapSpanContext({
    traceId: "4bf92f3577b34da6a3ce929d0e0e4736",
    spanId: "00f067aa0ba902b7",
    traceFlags: 1,
  });
  const tb = new FakeTallybook();
  await context.with(trace.setSpan(context.active(), span), () =>
    tb.effect("traced", { kind: "payment", target: "fakepay" }, async (fx) => {
      await Promise.resolve();
      fx.receipt({ system: "fakepay", externalId: "t1" });
    }),
  );
  assert.ok(await tb.flush());
  const effect = tb.fake.effects.get("traced");
  assert.deepEqual(
    [effect?.intent.trace_id, effect?.intent.span_id],
    ["4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"],
  );
  assert.equal(effect?.receipts[0]?.span_id, "00f067aa0ba902b7");
  await tb.close();
  context.disable();
});
