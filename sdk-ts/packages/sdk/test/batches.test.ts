/**
 * The sender delivers the spool's receipts and failures in batches (POST /api/v1/receipts/batch,
 * /failures/batch), as the Python SDK's does: each entry leaves the spool once its own result
 * says the server has it, a refused one is set aside alone, one the server could not take now
 * stays, and a lost answer leaves every entry of the batch to be sent again. Events
 * (POST /api/v1/events) are read the same way, one result per event.
 */

import assert from "node:assert/strict";
import { readdirSync } from "node:fs";
import { describe, test } from "node:test";
import { BATCH_ITEMS, type Tallybook } from "../src/client.js";
import { type Json, ServerUnavailable } from "../src/index.js";
import { FakeTallybook } from "../src/testing.js";
import { backends, intercept, type Sent } from "./backends.js";

const receipt = (n: number, prefix: string): Json => ({
  key: `${prefix}:send:${n}`,
  system: "smtp",
  external_id: `msg-${n}`,
});

/** What a process that ended with the server away left: `n` receipts, in order. */
function leftInSpool(tb: Tallybook, bodies: Json[], endpoint = "receipts"): string[] {
  return bodies.map((body) => tb.spool.put(endpoint, body).path);
}

function rejected(tb: Tallybook): string[] {
  return readdirSync(tb.spool.rejected).sort();
}

/** The items each batch request carried, and the status of each item's result. */
function items(sent: Sent[], path: string): number[] {
  return sent
    .filter((s) => s.path === path)
    .map((s) => ((s.body as Json)[path.split("/")[3] as string] as unknown[]).length);
}

let run = 0;

for (const make of backends()) {
  describe(`batches, on the ${make.name === "fake" ? "fake" : "server"}`, () => {
    test("a spool of 100 receipts is sent in one batch and leaves none behind", async () => {
      const b = make();
      const prefix = `b${run++}-${Date.now()}`;
      try {
        const sent = intercept(b.tb);
        leftInSpool(
          b.tb,
          Array.from({ length: 100 }, (_, n) => receipt(n, prefix)),
        );
        assert.ok(await b.tb.flush(60_000));
        assert.deepEqual(b.tb.spool.pending(), []);
        assert.deepEqual(rejected(b.tb), []);
        assert.deepEqual(
          sent.map((s) => [s.path, s.status]),
          [["/api/v1/receipts/batch", 207]],
        );
        assert.deepEqual(items(sent, "/api/v1/receipts/batch"), [BATCH_ITEMS]);
      } finally {
        await b.close();
      }
    });

    test("a batch with one refused receipt sets that one aside and delivers the others", async () => {
      const b = make();
      const prefix = `b${run++}-${Date.now()}`;
      try {
        const answers: Json[] = [];
        intercept(b.tb, async (path, _body, send) => {
          const answer = await send();
          if (path.endsWith("/batch")) answers.push(answer.body);
          return answer;
        });
        const files = leftInSpool(b.tb, [
          receipt(1, prefix),
          { ...receipt(2, prefix), colour: "red" },
          receipt(3, prefix),
        ]);
        // Failures for keys no intent recorded: the server settled nothing to fail (404), so
        // they are dropped with a warning, as one by one, not set aside.
        leftInSpool(
          b.tb,
          [1, 2].map((n) => ({ key: `${prefix}:unknown:${n}`, error: "declined", definitive: true })),
          "failures",
        );
        assert.ok(await b.tb.flush(60_000));
        assert.deepEqual(b.tb.spool.pending(), []);
        const refused = (files[1] as string).split("/").pop() as string;
        assert.deepEqual(rejected(b.tb), [refused.replace(/\.json$/, ".answer"), refused]);
        assert.deepEqual(
          answers.map((a) => (a.results as Json[]).map((r) => r.status)),
          [
            [201, 400, 201],
            [404, 404],
          ],
        );
      } finally {
        await b.close();
      }
    });
  });
}

describe("batches, answers the fake gives as a server might", () => {
  test("250 receipts go in batches of 100, and a lost answer leaves every entry of its batch in the spool", async () => {
    const tb = new FakeTallybook();
    let lost!: () => void;
    const answerLost = new Promise<void>((done) => {
      lost = done;
    });
    let batches = 0;
    const sent = intercept(tb, async (path, _body, send) => {
      const answer = await send();
      if (path.endsWith("/batch") && ++batches === 2) {
        // The server recorded the batch; its answer never came back, and it is away now.
        tb.fake.away = true;
        lost();
        throw new ServerUnavailable("POST /api/v1/receipts/batch: the connection was reset");
      }
      return answer;
    });
    const files = leftInSpool(
      tb,
      Array.from({ length: 250 }, (_, n) => receipt(n, "lost")),
    );
    const flushed = tb.flush(60_000);
    await answerLost;
    assert.deepEqual(tb.spool.pending(), files.slice(100), "the first batch acknowledged, no other");
    assert.equal(tb.fake.orphans.length, 200, "the second batch was recorded all the same");

    tb.fake.away = false;
    assert.ok(await flushed);
    assert.deepEqual(tb.spool.pending(), []);
    assert.deepEqual(
      sent.filter((s) => s.status !== null).map((s) => [s.path, s.status]),
      [
        ["/api/v1/receipts/batch", 207],
        ["/api/v1/receipts/batch", 207],
        ["/api/v1/receipts/batch", 207],
      ],
    );
    assert.deepEqual(items(sent, "/api/v1/receipts/batch").slice(0, 2), [100, 100]);
    assert.equal(tb.fake.orphans.length, 250, "nothing recorded twice");
    assert.deepEqual(rejected(tb), []);
    await tb.close();
  });

  test("an item the server could not take now stays in the spool and is sent again; the others leave", async () => {
    const tb = new FakeTallybook();
    const left: string[][] = [];
    const sent = intercept(tb, async (path, _body, send) => {
      left.push(tb.spool.pending());
      const answer = await send();
      if (path.endsWith("/batch")) {
        const results = answer.body.results as Json[];
        results[1] = { index: 1, status: 503, body: { error: "The database is unavailable" } };
      }
      return answer;
    });
    const files = leftInSpool(
      tb,
      [1, 2, 3].map((n) => receipt(n, "later")),
    );
    assert.ok(await tb.flush(60_000));
    assert.deepEqual(tb.spool.pending(), []);
    assert.deepEqual(rejected(tb), []);
    assert.deepEqual(
      sent.map((s) => [s.path, s.status]),
      [
        ["/api/v1/receipts/batch", 207],
        ["/api/v1/receipts", 200],
      ],
    );
    assert.deepEqual(left, [files, [files[1]]]);
    assert.equal(tb.fake.orphans.length, 3);
    await tb.close();
  });

  test("an intent waits for its key's receipt while the sender has it in a batch, and is answered completed", async () => {
    const tb = new FakeTallybook();
    const pay = { kind: "payment", target: "fakepay" };
    const first = await tb.fake.request("POST", "/api/v1/intents", { key: "pay:1", ...pay, worker: tb.worker });
    assert.equal(first.body.decision, "proceed");
    let release!: () => void;
    const held = new Promise<void>((done) => {
      release = done;
    });
    const sent = intercept(tb, async (path, _body, send) => {
      if (path.endsWith("/batch")) await held;
      return send();
    });
    leftInSpool(tb, [{ key: "pay:1", system: "fakepay", external_id: "re_1" }, receipt(2, "held"), receipt(3, "held")]);
    const flushed = tb.flush(60_000); // the batch is on its way now, its answer held
    const again = tb.effect("pay:1", pay, (fx) => fx.completed);
    release();
    assert.equal(await again, true);
    assert.ok(await flushed);
    assert.deepEqual(
      sent.map((s) => [s.path, s.status]),
      [
        ["/api/v1/receipts/batch", 207],
        ["/api/v1/intents", 200],
      ],
    );
    await tb.close();
  });

  test("a server without the batch routes is sent one by one from then on", async () => {
    const tb = new FakeTallybook();
    const sent = intercept(tb, async (path, _body, send) =>
      path.endsWith("/batch") ? { status: 404, body: { error: "Not found" } } : send(),
    );
    leftInSpool(
      tb,
      [1, 2].map((n) => receipt(n, "old")),
    );
    assert.ok(await tb.flush(60_000));
    leftInSpool(
      tb,
      [3, 4].map((n) => receipt(n, "old")),
    );
    assert.ok(await tb.flush(60_000));
    assert.deepEqual(
      sent.map((s) => [s.path, s.status]),
      [
        ["/api/v1/receipts/batch", 404],
        ["/api/v1/receipts", 201],
        ["/api/v1/receipts", 201],
        ["/api/v1/receipts", 201],
        ["/api/v1/receipts", 201],
      ],
    );
    assert.equal(tb.fake.orphans.length, 4);
    await tb.close();
  });

  test("events are read one result each: a rejected one is set aside, one the server could not take stays", async () => {
    const tb = new FakeTallybook();
    let once = true;
    intercept(tb, async (path, body, send) => {
      const answer = await send();
      const [event] = (body as Json).events ?? [];
      if (path === "/api/v1/events" && event?.run_id === "run-later" && once) {
        once = false;
        return {
          status: 207,
          body: { stored: 0, duplicates: 0, rejected: 0, results: [{ index: 0, id: event.id, status: 503 }] },
        };
      }
      return answer;
    });
    const run = (id: string, runId: string, status = "running"): Json => ({
      events: [{ type: "run", id, run_id: runId, status }],
    });
    const [, bad] = leftInSpool(
      tb,
      [run("e1", "run-ok"), { events: [{ type: "run", id: "e2" }] }, run("e3", "run-later"), run("e1", "run-ok")],
      "events",
    );
    assert.ok(await tb.flush(60_000));
    assert.deepEqual(tb.spool.pending(), []);
    const refused = (bad as string).split("/").pop() as string;
    assert.deepEqual(rejected(tb), [refused.replace(/\.json$/, ".answer"), refused]);
    assert.deepEqual(
      [...tb.fake.runs],
      [
        ["run-ok", "running"],
        ["run-later", "running"],
      ],
    );
    assert.deepEqual([...tb.fake.events.keys()], ["e1", "e3"]);
    await tb.close();
  });
});
