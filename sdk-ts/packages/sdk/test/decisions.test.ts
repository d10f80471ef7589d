/**
 * The decision table both SDKs run (tests/sdk/decisions.json), against the fake and, when
 * pytest gives one, the live server: an agent's tests on the fake mean what they say.
 */

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { describe, test } from "node:test";
import {
  type Effect,
  EffectConflict,
  EffectInterrupted,
  EffectUnsettled,
  type Json,
  ServerUnavailable,
} from "../src/index.js";
import { type Backend, backends, intercept, type Verdict } from "./backends.js";

const TABLE = JSON.parse(readFileSync(new URL("../../../../../tests/sdk/decisions.json", import.meta.url), "utf8"));
/** [what, the decision, the state after, and where given the reasons of the open cases after] */
type Step = [string, string | null, string, string[]?];
/**
 * The spool's steps: what a process that died before sending left in the spool with the key's
 * own report, and sends in one batch (the table's "steps" says each).
 */
const SPOOL_STEPS = ["batch", "batch_refused", "batch_lost", "fail_batch"];

class ProviderHungUp extends Error {}

/** Do one step; the decision the block was given (null for an operator's step). */
async function act(b: Backend, key: string, what: string, options: Json, n: number): Promise<string | null> {
  if (["not_happened", "happened", "abandon"].includes(what)) {
    await b.operator(key, what as Verdict);
    return null;
  }
  if (what === "late") {
    b.tb.receipt(key, { system: "fakepay", externalId: `re_late_${n}` });
    return null;
  }
  const request = { order: 42, other: what === "other" };
  if (what === "die") {
    const intent = { key, kind: "payment", target: "fakepay", request, worker: "a process that died", ...options };
    const answer = await b.api.request("POST", "/api/v1/intents", intent);
    assert.equal(answer.status, 201, JSON.stringify(answer.body));
    return answer.body.decision;
  }
  if (SPOOL_STEPS.includes(what)) {
    leftInSpool(b, key, what, n);
    return null;
  }
  let given: Effect | undefined;
  try {
    await b.tb.effect(key, { kind: "payment", target: "fakepay", request, ...options }, async (fx) => {
      given = fx;
      if (what === "receipt") fx.receipt({ system: "fakepay", externalId: `re_${n}` });
      else if (what === "fail") fx.fail("declined", { definitive: true });
      else if (what === "crash") throw new ProviderHungUp("fakepay hung up");
    });
  } catch (error) {
    if (error instanceof EffectInterrupted) return error.decision;
    if (!(error instanceof ProviderHungUp || error instanceof EffectUnsettled)) throw error;
  }
  return given?.decision ?? null;
}

/**
 * The key's report and two others, written to the spool as a process that died before sending
 * them left them; the client sends them in one batch (flushed by the caller).
 */
function leftInSpool(b: Backend, key: string, what: string, n: number): void {
  const keys = [key, `${key}:step${n}:1`, `${key}:step${n}:2`];
  const endpoint = what === "fail_batch" ? "failures" : "receipts";
  const bodies: Json[] = keys.map((k) =>
    endpoint === "failures"
      ? { key: k, error: "declined", definitive: true }
      : { key: k, system: "fakepay", external_id: `re_${n}` },
  );
  if (what === "batch_refused") (bodies[1] as Json).colour = "red";
  if (what === "batch_lost") {
    // The next batch reaches the server, which records it; its answer is lost on the way.
    let lost = false;
    intercept(b.tb, async (path, _body, send) => {
      const answer = await send();
      if (path.endsWith("/batch") && !lost) {
        lost = true;
        throw new ServerUnavailable(`POST ${path}: the connection was reset`);
      }
      return answer;
    });
  }
  for (const body of bodies) b.tb.spool.put(endpoint, body);
}

function rejectedCount(b: Backend): number {
  return readdirSync(b.tb.spool.rejected).filter((name) => name.endsWith(".json")).length;
}

/** The first intent's claim with `change`; a grant is the index of one of the backend's. */
function claim(b: Backend, change: Json): Json {
  const { grant, ...rest } = { ...TABLE.first_claim, ...change };
  return { ...rest, authority: grant === null ? null : { grant: b.grants[grant] } };
}

for (const make of backends()) {
  describe(`the decision table on the ${make.name === "fake" ? "fake" : "server"}`, () => {
    let n = 0;
    const names = Object.keys(TABLE.cases);
    for (const name of names) {
      test(name, async () => {
        const b = make();
        const key = `${TABLE.key}:${b.name}:${n++}`;
        const { options, steps } = TABLE.cases[name] as { options: Json; steps: Step[] };
        let refused = 0;
        try {
          for (const [i, [what, decision, state, cases]] of steps.entries()) {
            const where = `${name}, step ${i}: ${what}`;
            assert.equal(await act(b, key, what, options, i), decision, where);
            assert.ok(await b.tb.flush());
            assert.equal(await b.state(key), state, where);
            const detail = (await b.api.request("GET", `/api/v1/effects?key=${encodeURIComponent(key)}`)).body;
            if (cases !== undefined) {
              assert.deepEqual(detail.cases.map((c: Json) => c.reason).sort(), cases, where);
            }
            if (what === "batch_lost") assert.equal(detail.receipts.length, 1, where);
            if (what === "batch_refused") refused += 1;
            assert.equal(rejectedCount(b), refused, where);
          }
        } finally {
          await b.close();
        }
      });
    }

    for (const [change, { change: changed, differs }] of Object.entries(TABLE.claims as Json)) {
      for (const outcome of ["receipt", "fail"]) {
        test(`another claim: ${change}, after a ${outcome}`, async () => {
          const b = make();
          const key = `${TABLE.key}:${b.name}:${n++}`;
          const request = TABLE.request;
          try {
            await b.tb.effect(key, { request, ...claim(b, {}) } as never, async (fx: Effect) => {
              assert.equal(fx.decision, "proceed");
              if (outcome === "receipt") fx.receipt({ system: "fakepay", externalId: "re_1" });
              else fx.fail("declined", { definitive: true });
            });
            assert.ok(await b.tb.flush());
            const state = await b.state(key);
            const again = (body: (fx: Effect) => Promise<void>) =>
              b.tb.effect(key, { request, ...claim(b, changed) } as never, body);
            if (differs === null) {
              await again(async (fx) => {
                assert.equal(fx.decision, outcome === "receipt" ? "completed" : "proceed");
                if (!fx.completed) fx.receipt({ system: "fakepay", externalId: "re_2" });
              });
              assert.ok(await b.tb.flush());
              assert.equal(await b.state(key), "succeeded");
              return;
            }
            const report = await again(async () => assert.fail("a conflict is not performed")).then(
              () => assert.fail("no conflict"),
              (error: unknown) => error,
            );
            assert.ok(report instanceof EffectConflict, String(report));
            assert.equal(report.case?.reason, "key_reuse_conflict");
            assert.ok(report.reason.includes(`a different ${differs};`), report.reason);
            assert.equal(report.case?.summary, `Key '${key}' was reused with a different ${differs}.`);
            assert.ok(report.caseUrl?.endsWith(`/cases/${report.case?.id}/`), String(report.caseUrl));
            assert.equal(await b.state(key), state);
          } finally {
            await b.close();
          }
        });
      }
    }
  });
}
