/** The client's rules, on the fake: fail closed, the spool, tools, runs and recovery. */

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { test } from "node:test";
import { intentBudgetMs } from "../src/client.js";
import {
  canonical,
  EffectDenied,
  EffectInDoubt,
  EffectUnsettled,
  fingerprint,
  IntentNotRecorded,
  type Json,
  ReceiptConflict,
  Tallybook,
} from "../src/index.js";
import { FakeServer, FakeTallybook } from "../src/testing.js";
import { FAST, spoolRoot } from "./backends.js";

const PAY = { kind: "payment", target: "fakepay" } as const;

test("an effect proceeds, its receipt completes it, and the next call skips it", async () => {
  const tb = new FakeTallybook();
  const refunds: string[] = [];
  const refund = () =>
    tb.effect("refund:42", { ...PAY, request: { order: 42 } }, async (fx) => {
      if (fx.completed) return fx.stored?.externalId;
      refunds.push("re_1");
      fx.receipt({ system: "fakepay", externalId: "re_1", observedAt: new Date(0) });
      return "re_1";
    });
  assert.equal(await refund(), "re_1");
  assert.ok(await tb.flush());
  assert.equal(await refund(), "re_1");
  assert.deepEqual(refunds, ["re_1"]);
  assert.equal(tb.fake.state("refund:42"), "succeeded");
  assert.equal(tb.fake.effects.get("refund:42")?.receipts[0]?.observed_at, "1970-01-01T00:00:00.000Z");
  await tb.close();
});

test("a server that is away means the effect is not performed (fail closed), within the budget", async () => {
  const tb = new Tallybook({ url: "http://127.0.0.1:9", apiKey: "tb_x", spool: spoolRoot(), ...FAST });
  let ran = false;
  const report = await tb
    .effect("refund:1", PAY, () => {
      ran = true;
    })
    .catch((error: unknown) => error);
  assert.ok(report instanceof IntentNotRecorded, String(report));
  assert.equal(report.decision, "unrecorded");
  assert.equal(report.case, null);
  assert.ok(report.message.includes("the effect was not performed"));
  assert.equal(ran, false);
});

test("failOpen runs a harmless effect anyway and sends its intent later", async () => {
  const tb = new FakeTallybook();
  tb.fake.away = true;
  const decision = await tb.effect("ping:1", { kind: "ping", target: "monitor", failOpen: true }, (fx) => {
    fx.receipt({ system: "monitor", externalId: "p1" });
    return fx.decision;
  });
  assert.equal(decision, "unrecorded");
  tb.fake.away = false;
  assert.ok(await tb.flush());
  assert.equal(tb.fake.state("ping:1"), "succeeded");
  await tb.close();
});

test("a receipt is on disk when fx.receipt returns, and the next client sends what this one could not", async () => {
  const root = spoolRoot();
  const fake = new FakeServer();
  const first = new FakeTallybook(fake, { spool: root });
  await first.effect("refund:7", PAY, (fx) => {
    fake.away = true;
    fx.receipt({ system: "fakepay", externalId: "re_7" });
    const written = readdirSync(root).filter((name) => name.endsWith(".json"));
    assert.equal(written.length, 1, "fsynced before fx.receipt returned");
  });
  assert.equal(await first.flush(300), false);
  await first.close(100);
  assert.equal(fake.state("refund:7"), "pending");

  fake.away = false;
  const next = new FakeTallybook(fake, { spool: root });
  next.receipt("unrelated", { system: "fakepay", externalId: "x" });
  assert.ok(await next.flush());
  assert.equal(fake.state("refund:7"), "succeeded");
  await next.close();
});

test("an error in the block is an unknown outcome unless declared definitive", async () => {
  class Declined extends Error {}
  const tb = new FakeTallybook();
  await assert.rejects(
    tb.effect("a", { ...PAY, definitiveOn: [Declined] }, () => {
      throw new Declined("card declined");
    }),
    Declined,
  );
  await assert.rejects(
    tb.effect("b", PAY, () => {
      throw new Error("hung up");
    }),
    /hung up/,
  );
  await assert.rejects(
    tb.effect("c", PAY, () => {}),
    EffectUnsettled,
  );
  assert.ok(await tb.flush());
  assert.deepEqual(
    ["a", "b", "c"].map((k) => tb.fake.state(k)),
    ["failed", "timed_out", "timed_out"],
  );
  const inDoubt = await tb.effect("b", PAY, () => {}).catch((error: unknown) => error);
  assert.ok(inDoubt instanceof EffectInDoubt);
  assert.equal(inDoubt.case?.reason, "uncertain");
  assert.ok(inDoubt.message.includes(`Case #${inDoubt.case?.id} (uncertain): ${inDoubt.caseUrl}`));
  await tb.close();
});

test("one block takes one outcome", async () => {
  const tb = new FakeTallybook();
  await tb.effect("k", PAY, (fx) => {
    fx.receipt({ system: "fakepay", externalId: "1" });
    fx.receipt({ system: "fakepay", externalId: "1" });
    assert.throws(() => fx.receipt({ system: "fakepay", externalId: "2" }), ReceiptConflict);
    assert.throws(() => fx.fail("no"), ReceiptConflict);
  });
  await tb.close();
});

test("a misspelt option or a missing kind is refused before anything is sent", async () => {
  const tb = new FakeTallybook();
  await assert.rejects(
    tb.effect("k", { ...PAY, replays: "safe" } as never, () => {}),
    /unknown effect option\(s\): replays/,
  );
  await assert.rejects(
    tb.effect("k", { target: "x" } as never, () => {}),
    /an effect needs kind/,
  );
  assert.equal(tb.fake.effects.size, 0);
  await tb.close();
});

test("tb.run scopes the run id and the workflow version; a tool's key comes from its arguments", async () => {
  const tb = new FakeTallybook();
  const sent: string[] = [];
  const sendEmail = tb.tool(
    "email:{runId}:{to}",
    { kind: "email", target: "smtp", receipt: "id" },
    async ({ to }: { to: string }) => {
      sent.push(to);
      return { id: `msg-${sent.length}`, queued: true };
    },
  );
  const results = await tb.run({ workflow: "mailer", version: "2.3.0", runId: "ticket-9" }, async (runId) => {
    assert.equal(runId, "ticket-9");
    assert.equal(tb.currentRun(), "ticket-9");
    return [await sendEmail({ to: "ann@example.com" }), await sendEmail({ to: "ann@example.com" })];
  });
  assert.deepEqual(results, [
    { id: "msg-1", queued: true },
    { id: "msg-1", queued: true },
  ]);
  assert.deepEqual(sent, ["ann@example.com"]);
  const effect = tb.fake.effects.get("email:ticket-9:ann@example.com");
  assert.deepEqual(effect?.intent.request, { to: "ann@example.com" });
  assert.equal(effect?.intent.run_id, "ticket-9");
  assert.deepEqual(effect?.intent.context, { workflow: "mailer", workflow_version: "2.3.0" });
  assert.deepEqual(effect?.receipts[0]?.data, { result: { id: "msg-1", queued: true } });
  await assert.rejects(sendEmail({ to: "bob@example.com" }), /names \{runId\}, but none is current/);
  await tb.close();
});

test("a tool returning its Receipt, and a key function", async () => {
  const tb = new FakeTallybook();
  const charge = tb.tool(
    (args: { order: number }) => `charge:${args.order}`,
    PAY,
    async ({ order }) => ({
      system: "fakepay",
      externalId: `ch_${order}`,
    }),
  );
  assert.equal((await charge({ order: 3 })).externalId, "ch_3");
  assert.ok(await tb.flush());
  assert.equal((await charge({ order: 3 })).externalId, "ch_3");
  assert.equal(tb.fake.effects.get("charge:3")?.receipts.length, 1);
  await tb.close();
});

test("onInDoubt's receipt settles an effect in doubt as completed; waitInDoubtMs waits for a person", async () => {
  const tb = new FakeTallybook();
  await assert.rejects(
    tb.effect("r", PAY, () => {}),
    EffectUnsettled,
  );
  assert.ok(await tb.flush());
  const asked: string[] = [];
  const done = await tb.effect(
    "r",
    {
      ...PAY,
      onInDoubt: (report) => {
        asked.push(report.case?.reason ?? "");
        return { system: "fakepay", externalId: "found" };
      },
    },
    (fx) => fx.completed,
  );
  assert.equal(done, true);
  assert.deepEqual(asked, ["uncertain"]);
  assert.deepEqual(tb.fake.openCases("r"), ["late_success"]);

  await assert.rejects(
    tb.effect("s", PAY, () => {}),
    EffectUnsettled,
  );
  assert.ok(await tb.flush());
  setTimeout(() => tb.fake.settle("s", false), 50);
  const ran = await tb.effect("s", { ...PAY, onInDoubt: () => null, waitInDoubtMs: 5000 }, (fx) => {
    fx.receipt({ system: "fakepay", externalId: "s2" });
    return fx.attempt;
  });
  assert.equal(ran, 2);
  const still = await tb.effect("t", PAY, () => {}).catch(() => null);
  assert.equal(still, null);
  assert.ok(await tb.flush());
  await assert.rejects(tb.waitFor("t", { timeoutMs: 50, pollMs: 10 }), /Still waiting after 0.05 s/);
  await tb.close();
});

test("a denial names its reason and case", async () => {
  const tb = new FakeTallybook(new FakeServer({ denied: ["payment"] }));
  const report = await tb.effect("d", PAY, () => {}).catch((error: unknown) => error);
  assert.ok(report instanceof EffectDenied);
  assert.equal(report.case?.reason, "authority_denied");
  assert.equal((report.effect as Json).state, "denied");
  await tb.close();
});

test("approvals: waitForApprovalMs runs the block once a person approves", async () => {
  const tb = new FakeTallybook(new FakeServer({ approval: ["payment"] }));
  setTimeout(() => tb.fake.approve("big"), 50);
  const decision = await tb.effect("big", { ...PAY, waitForApprovalMs: 5000 }, (fx) => {
    fx.receipt({ system: "fakepay", externalId: "b1" });
    return fx.decision;
  });
  assert.equal(decision, "proceed");
  await tb.close();
});

test("the intent budget is the option, else $TALLYBOOK_INTENT_BUDGET in seconds, else 2 s", () => {
  const before = process.env.TALLYBOOK_INTENT_BUDGET;
  try {
    delete process.env.TALLYBOOK_INTENT_BUDGET;
    assert.equal(intentBudgetMs({}), 2000);
    process.env.TALLYBOOK_INTENT_BUDGET = "30";
    assert.equal(intentBudgetMs({}), 30_000);
    assert.equal(intentBudgetMs({ intentBudgetMs: 500 }), 500);
    process.env.TALLYBOOK_INTENT_BUDGET = "0.5";
    assert.equal(intentBudgetMs({}), 500);
    process.env.TALLYBOOK_INTENT_BUDGET = "soon";
    assert.throws(() => intentBudgetMs({}), /TALLYBOOK_INTENT_BUDGET=soon/);
  } finally {
    if (before === undefined) delete process.env.TALLYBOOK_INTENT_BUDGET;
    else process.env.TALLYBOOK_INTENT_BUDGET = before;
  }
});

test("the arguments' fingerprint is Python's (tests/sdk/fingerprints.json, computed by Python)", () => {
  const vectors = JSON.parse(
    readFileSync(new URL("../../../../../tests/sdk/fingerprints.json", import.meta.url), "utf8"),
  ) as Array<{ args: unknown; fingerprint: string }>;
  assert.ok(vectors.length > 5);
  for (const { args, fingerprint: expected } of vectors) {
    assert.equal(fingerprint(args), expected, `${canonical(args)}`);
  }
});

test("a run event says the run goes, then that it ended, sent in the background", async () => {
  const tb = new FakeTallybook();
  tb.runEvent("ticket-7", "running", { workflow: "pi", agent: "pi" });
  assert.ok(await tb.flush());
  assert.equal(tb.fake.runs.get("ticket-7"), "running");
  tb.runEvent("ticket-7", "ok", { workflow: "pi" });
  assert.ok(await tb.flush());
  assert.equal(tb.fake.runs.get("ticket-7"), "ok");
  await tb.close();
});
