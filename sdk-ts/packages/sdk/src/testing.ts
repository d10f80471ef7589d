/**
 * An in-memory Tallybook for an agent's own tests: no server, the same decisions.
 *
 *     import { FakeTallybook } from "@tallybook/sdk/testing";
 *     const tb = new FakeTallybook();
 *     await refundOrder(tb, 42);
 *     await refundOrder(tb, 42);                 // a restart
 *     assert.equal(tb.fake.state("refund:42"), "succeeded");
 *
 * The client is the real one (spool, rules, tools); only the server is replaced, by
 * `FakeServer`, which follows the decision table of the documentation, as the Python SDK's
 * `tallybook.testing` does: a new key proceeds, a receipt completes it, an outcome nobody knows
 * is in doubt until an operator (`tb.fake.settle(...)`) says what happened, a key reused for
 * another request or another claim (kind, target, authority or amount) is a conflict.
 * Authority is granted unless `new FakeServer({ approval, denied })` names the kind. The
 * multi-status routes answer one result per item, as the server's: the batches of receipts and
 * failures the sender sends, and run and span events (kept by id in `fake.events`, each run's
 * latest status in `fake.runs`). Tallybook's own tests run one table of cases
 * (tests/sdk/decisions.json) against this fake and the real server, so the two agree.
 */

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { type Config, intentBudgetMs, Tallybook, type TallybookOptions } from "./client.js";
import { ServerUnavailable } from "./errors.js";
import { canonical, fingerprint, type Json } from "./records.js";
import { Spool } from "./spool.js";
import { type Channel, type Response, Retry } from "./transport.js";

export const URL = "http://tallybook.test";
const RETRYABLE_AFTER_TIMEOUT = ["safe", "idempotent"];
const LATE_FROM = ["timed_out", "failed", "not_happened", "abandoned"];

/** The fields each endpoint takes, the required ones first (as the server's schemas). */
export const TAKES: Record<string, [string[], string[]]> = {
  "/api/v1/intents": [
    ["key", "kind", "target"],
    [
      "request",
      "fingerprint",
      "replay",
      "timeout_s",
      "run_id",
      "tool_call_id",
      "trace_id",
      "span_id",
      "worker",
      "context",
      "authority",
      "amount",
    ],
  ],
  "/api/v1/receipts": [
    ["key", "system", "external_id"],
    ["observed_at", "data", "amount", "target", "attempt", "trace_id", "span_id"],
  ],
  "/api/v1/failures": [["key", "error"], ["definitive"]],
  "/api/v1/timeouts": [["key", "reason"], []],
  "/api/v1/events": [["events"], []],
};

/** The batch routes of the reports the SDK spools, and the field that holds their items. */
export const BATCHES: Record<string, string> = {
  "/api/v1/receipts/batch": "receipts",
  "/api/v1/failures/batch": "failures",
};
export const MAX_BATCH = 100;
export const MAX_EVENTS = 1000;
/** What each event type requires besides its id (as the server's schemas). */
const EVENT_REQUIRES: Record<string, string[]> = {
  run: ["run_id"],
  span: ["trace_id", "span_id", "name", "start"],
};

const now = (): string => new Date().toISOString();

export interface FakeEffect {
  id: number;
  key: string;
  kind: string;
  target: string;
  fingerprint: string;
  claim: Json;
  intent: Json;
  replay: string;
  state: string;
  attempt: number;
  worker: string | null;
  runId: string | null;
  late: boolean;
  deadline: string | null;
  receipts: Json[];
  cases: Json[];
  attempts: Json[];
  created: string;
  updated: string;
}

/** The ledger's decision table in memory, answering the client as the HTTP API would. */
export class FakeServer implements Channel {
  readonly url = URL;
  readonly timeoutMs = 1000;
  readonly retry = new Retry(0);
  readonly effects = new Map<string, FakeEffect>();
  readonly closedCases: Json[] = [];
  readonly orphans: Json[] = [];
  readonly approval: string[];
  readonly denied: string[];
  /** While true, every request fails as if the server were away (an outage in a test). */
  away = false;
  private ids = 0;

  constructor(options: { approval?: string[]; denied?: string[] } = {}) {
    this.approval = options.approval ?? [];
    this.denied = options.denied ?? [];
  }

  // -- what an operator does on the desk -----------------------------------------------------

  state(key: string): string {
    return this.get(key).state;
  }

  /** The reasons of the effect's open cases. */
  openCases(key: string): string[] {
    return this.get(key).cases.map((c) => c.reason);
  }

  /** An operator's verdict on an effect in doubt. */
  settle(key: string, happened: boolean, externalId = "operator"): void {
    const effect = this.in(key, "timed_out");
    if (happened) effect.receipts.push(this.receiptRow(key, "operator", externalId, "operator_attested"));
    this.move(effect, happened ? "succeeded" : "not_happened");
    this.close(effect, "uncertain");
  }

  abandon(key: string): void {
    const effect = this.in(key, "timed_out", "succeeded");
    this.move(effect, "abandoned");
    effect.cases.length = 0;
  }

  approve(key: string, approve = true): void {
    const effect = this.in(key, "awaiting_approval");
    this.move(effect, approve ? "pending" : "denied");
    this.close(effect, "approval_required");
  }

  // -- the API --------------------------------------------------------------------------------

  async request(method: string, path: string, body?: unknown): Promise<Response> {
    if (this.away) throw new ServerUnavailable(`${method} ${URL}${path}: the fake is away`);
    // Through JSON, as over HTTP: nothing the client keeps is shared with the ledger.
    const given = body === undefined ? undefined : JSON.parse(JSON.stringify(body));
    if (method === "GET" && path.startsWith("/api/v1/effects?key=")) {
      return this.status(decodeURIComponent(path.split("=", 2)[1] ?? ""));
    }
    const handlers: Record<string, (body: Json) => Response> = {
      "/api/v1/intents": (b) => this.intent(b),
      "/api/v1/receipts": (b) => this.receiptIn(b),
      "/api/v1/failures": (b) => this.report(b.key, b.definitive ? "failed" : "timed_out"),
      "/api/v1/timeouts": (b) => this.report(b.key, "timed_out"),
      "/api/v1/events": (b) => this.eventsIn(b),
    };
    const single = BATCHES[path] === undefined ? path : path.slice(0, -"/batch".length);
    const handler = handlers[single];
    if (method !== "POST" || handler === undefined) {
      return { status: 404, body: { error: `the fake has no ${method} ${path}` } };
    }
    if (single !== path) return this.batch(path, given, handler);
    return refused(path, given) ?? handler(given);
  }

  /**
   * A batch of reports: each answered as its single route would, in order (207); the batch
   * itself refused (400) only when it is no batch of 1 to MAX_BATCH items.
   */
  private batch(path: string, body: unknown, handler: (body: Json) => Response): Response {
    const name = BATCHES[path] as string;
    const items = body && typeof body === "object" ? (body as Json)[name] : undefined;
    if (
      !Array.isArray(items) ||
      items.length < 1 ||
      items.length > MAX_BATCH ||
      Object.keys(body as Json).length !== 1
    ) {
      return {
        status: 400,
        body: { error: "Invalid request", fields: { [name]: `A list of 1 to ${MAX_BATCH} items` } },
      };
    }
    const single = path.slice(0, -"/batch".length);
    const results = items.map((item, index) => {
      const answer = refused(single, item) ?? handler(item);
      return { index, status: answer.status, body: answer.body };
    });
    return { status: 207, body: { results } };
  }

  /** The runs' latest status by run id, from the run events received. */
  readonly runs = new Map<string, string>();
  /** The ids of the events received: one sent again is a duplicate, as on the server. */
  readonly events = new Map<string, Json>();

  /** Run and span events: each stored, a duplicate or rejected on its own (207), as the server. */
  private eventsIn(body: Json): Response {
    const events = body.events;
    if (!Array.isArray(events) || events.length < 1 || events.length > MAX_EVENTS) {
      return {
        status: 400,
        body: { error: "Invalid request", fields: { events: `A list of 1 to ${MAX_EVENTS} events` } },
      };
    }
    const counts = { stored: 0, duplicate: 0, rejected: 0 };
    const results = events.map((event: unknown, index: number) => {
      const problem = eventProblem(event);
      const id =
        event && typeof event === "object" && typeof (event as Json).id === "string" ? (event as Json).id : null;
      if (problem !== null) {
        counts.rejected += 1;
        return { index, id, status: 400, result: "rejected", ...problem };
      }
      const given = event as Json;
      if (this.events.has(given.id)) {
        counts.duplicate += 1;
        return { index, id, status: 200, result: "duplicate" };
      }
      this.events.set(given.id, given);
      if (given.type === "run" && given.status) this.runs.set(given.run_id, given.status);
      counts.stored += 1;
      return { index, id, status: 201, result: "stored" };
    });
    const { stored, duplicate: duplicates, rejected } = counts;
    return { status: 207, body: { stored, duplicates, rejected, results } };
  }

  private intent(intent: Json): Response {
    const key = intent.key as string;
    const fingerprint = intent.fingerprint || fingerprintOf(intent.request ?? null);
    const claim = claimOf(intent);
    let effect = this.effects.get(key);
    if (effect === undefined) {
      const created = now();
      effect = {
        id: this.nextId(),
        key,
        kind: intent.kind,
        target: intent.target,
        fingerprint,
        claim,
        intent,
        replay: intent.replay ?? "never",
        state: "pending",
        attempt: 0,
        worker: null,
        runId: null,
        late: false,
        deadline: null,
        receipts: [],
        cases: [],
        attempts: [],
        created,
        updated: created,
      };
      this.effects.set(key, effect);
      if (this.denied.includes(intent.kind)) {
        this.move(effect, "denied");
        return this.answer(201, "denied", effect, this.open(effect, "authority_denied"));
      }
      if (this.approval.includes(intent.kind)) {
        this.move(effect, "awaiting_approval");
        return this.answer(201, "wait", effect, this.open(effect, "approval_required"));
      }
      this.attempt(effect, intent);
      return this.answer(201, "proceed", effect);
    }
    if (effect.fingerprint !== fingerprint || fingerprintOf(effect.claim) !== fingerprintOf(claim)) {
      return this.conflict(effect, fingerprint, claim);
    }
    if (effect.state === "pending") {
      if (effect.attempt === 0 || (intent.worker && intent.worker === effect.worker)) {
        if (effect.attempt === 0) this.attempt(effect, intent);
        return this.answer(200, "proceed", effect);
      }
      if (intent.run_id && intent.run_id === effect.runId && effect.worker) {
        // The same run resumed in another process: the attempt was interrupted.
        this.move(effect, "timed_out");
        this.open(effect, "uncertain");
      }
    }
    if (
      ["failed", "not_happened"].includes(effect.state) ||
      (effect.state === "timed_out" && RETRYABLE_AFTER_TIMEOUT.includes(effect.replay))
    ) {
      this.move(effect, "pending");
      effect.late = false;
      this.close(effect, "uncertain");
      this.attempt(effect, intent);
      return this.answer(200, "proceed", effect);
    }
    const [decision, opened] = this.decide(effect);
    return this.answer(200, decision, effect, opened);
  }

  /** What was checked and approved is the first intent's request and claim (the server's words). */
  private conflict(effect: FakeEffect, fingerprint: string, claim: Json): Response {
    const differs = Object.keys(effect.claim).filter((k) => canonical(effect.claim[k]) !== canonical(claim[k]));
    const request = effect.fingerprint !== fingerprint;
    const what = [...differs, ...(request ? ["request"] : [])].join(", ") || "authority";
    const summary = `Key '${effect.key}' was reused with a different ${what}.`;
    const opened = this.open(effect, "key_reuse_conflict", "high", summary);
    const reason =
      `Key '${effect.key}' was first recorded with a different ${what}` +
      (request ? ` (fingerprint ${effect.fingerprint.slice(0, 12)}…, this one ${fingerprint.slice(0, 12)}…)` : "") +
      "; do not perform it: what was checked and approved is the first intent's request and claim. " +
      "Give a different effect its own key.";
    return this.answer(409, "conflict", effect, opened, reason);
  }

  private decide(effect: FakeEffect): [string, Json | null] {
    switch (effect.state) {
      case "succeeded":
        return ["completed", null];
      case "failed":
      case "not_happened":
        return ["proceed", null];
      case "timed_out":
        if (RETRYABLE_AFTER_TIMEOUT.includes(effect.replay)) return ["proceed", this.caseOf(effect, "uncertain")];
        return ["wait", this.caseOf(effect, "uncertain") ?? this.open(effect, "uncertain")];
      case "pending":
        return [effect.attempt === 0 ? "proceed" : "wait", null];
      case "awaiting_approval":
        return ["wait", this.caseOf(effect, "approval_required")];
      default:
        return ["denied", null];
    }
  }

  private receiptIn(receipt: Json): Response {
    const { key, system, external_id: externalId } = receipt;
    const effect = this.effects.get(key);
    const known = effect ? effect.receipts : this.orphans.filter((r) => r.key === key);
    const same = known.find((r) => r.system === system && r.external_id === externalId);
    if (same !== undefined) {
      return {
        status: 200,
        body: { receipt: same, effect: effect ? toJson(effect) : null, case: null, created: false },
      };
    }
    const row = this.receiptRow(key, system, externalId, "agent_reported", receipt);
    if (effect === undefined) {
      this.orphans.push(row);
      const orphan = this.newCase(
        "orphan_receipt",
        "high",
        `A receipt from ${system} (${externalId}) names key '${key}', which no intent has recorded.`,
      );
      return { status: 201, body: { receipt: row, effect: null, case: orphan, created: true } };
    }
    let opened: Json | null = null;
    if (effect.state === "pending") {
      this.move(effect, "succeeded");
    } else if (LATE_FROM.includes(effect.state)) {
      row.late = true;
      effect.late = true;
      this.move(effect, "succeeded");
      this.close(effect, "uncertain");
      opened = this.open(effect, "late_success");
    } else if (["succeeded", "compensated"].includes(effect.state)) {
      opened = this.open(effect, "duplicate_effect", "critical");
    } else {
      opened = this.open(effect, "unauthorized_effect", "critical");
    }
    effect.receipts.push(row);
    return { status: 201, body: { receipt: row, effect: toJson(effect), case: opened, created: true } };
  }

  /** A failure or a timeout the agent reports: 404 for an unknown key, 409 where refused. */
  private report(key: string, target: string): Response {
    const effect = this.effects.get(key);
    if (effect === undefined) {
      return { status: 404, body: { error: `no effect has the key '${key}'`, fields: { key: "Unknown" } } };
    }
    let opened = target === "timed_out" ? this.caseOf(effect, "uncertain") : null;
    if (effect.state === target) return { status: 200, body: { effect: toJson(effect), case: opened, changed: false } };
    if (effect.state !== "pending") return { status: 409, body: { error: `effect '${key}' is ${effect.state}` } };
    this.move(effect, target);
    if (target === "timed_out") opened = this.open(effect, "uncertain");
    return { status: 200, body: { effect: toJson(effect), case: opened, changed: true } };
  }

  private status(key: string): Response {
    const effect = this.effects.get(key);
    if (effect === undefined) return { status: 404, body: { error: `no effect has the key '${key}'` } };
    const [decision] = this.decide(effect);
    const intent = effect.intent;
    const grant = intent.authority?.grant;
    return {
      status: 200,
      body: {
        effect: toJson(effect),
        request: intent.request ?? null,
        payload_pruned: null,
        authority: intent.authority ?? null,
        amount: amountOf(intent.amount),
        grant: Number.isInteger(grant) ? grantOf(grant, intent.amount) : null,
        attempts: effect.attempts,
        receipts: effect.receipts,
        cases: effect.cases,
        decision,
        reason: `The fake's decision for a ${effect.state} effect.`,
        run_id: intent.run_id ?? null,
        tool_span_id: null,
        model_span_id: null,
      },
    };
  }

  // -- bookkeeping ----------------------------------------------------------------------------

  private answer(
    status: number,
    decision: string,
    effect: FakeEffect,
    opened: Json | null = null,
    reason?: string,
  ): Response {
    const receipt = decision === "completed" ? (effect.receipts[0] ?? null) : null;
    return {
      status,
      body: {
        decision,
        reason: reason ?? `The fake's decision for a ${effect.state} effect.`,
        effect: toJson(effect),
        receipt,
        case: opened,
      },
    };
  }

  private move(effect: FakeEffect, state: string): void {
    effect.state = state;
    effect.updated = now();
  }

  private attempt(effect: FakeEffect, intent: Json): void {
    effect.attempt += 1;
    effect.worker = intent.worker ?? null;
    effect.runId = intent.run_id ?? null;
    const started = new Date();
    effect.deadline = intent.timeout_s ? new Date(started.getTime() + intent.timeout_s * 1000).toISOString() : null;
    effect.updated = now();
    effect.attempts.push({
      number: effect.attempt,
      started: started.toISOString(),
      deadline: effect.deadline,
      context: intent.context ?? {},
      run_id: intent.run_id ?? "",
      worker: intent.worker ?? "",
      trace_id: intent.trace_id ?? "",
      span_id: intent.span_id ?? "",
    });
  }

  private caseOf(effect: FakeEffect, reason: string): Json | null {
    return effect.cases.find((c) => c.reason === reason) ?? null;
  }

  private open(effect: FakeEffect, reason: string, severity = "high", summary = ""): Json {
    let opened = this.caseOf(effect, reason);
    if (opened === null) {
      opened = this.newCase(reason, severity, summary || `${reason.replaceAll("_", " ")}: ${effect.key}`);
      effect.cases.push(opened);
    }
    return opened;
  }

  private newCase(reason: string, severity: string, summary: string): Json {
    const id = this.nextId();
    return { id, reason, severity, summary, opened: now(), closed: null, url: `${URL}/cases/${id}/` };
  }

  private close(effect: FakeEffect, reason: string): void {
    const opened = this.caseOf(effect, reason);
    if (opened !== null) {
      effect.cases.splice(effect.cases.indexOf(opened), 1);
      opened.closed = now();
      this.closedCases.push(opened);
    }
  }

  private receiptRow(key: string, system: string, externalId: string, strength: string, given: Json = {}): Json {
    return {
      id: this.nextId(),
      key,
      system,
      external_id: externalId,
      observed_at: given.observed_at ?? null,
      data: given.data ?? null,
      strength,
      attempt: given.attempt ?? null,
      trace_id: given.trace_id ?? "",
      span_id: given.span_id ?? "",
      late: false,
      received: now(),
      amount: amountOf(given.amount),
      target: given.target ?? null,
    };
  }

  private get(key: string): FakeEffect {
    const effect = this.effects.get(key);
    if (effect === undefined) throw new Error(`no effect has the key '${key}'`);
    return effect;
  }

  private in(key: string, ...states: string[]): FakeEffect {
    const effect = this.get(key);
    if (!states.includes(effect.state))
      throw new Error(`effect '${key}' is ${effect.state}, not ${states.join(" or ")}`);
    return effect;
  }

  private nextId(): number {
    this.ids += 1;
    return this.ids;
  }
}

function toJson(effect: FakeEffect): Json {
  const { id, key, kind, target, state, late, replay, fingerprint, attempt, deadline, created, updated } = effect;
  return {
    id,
    key,
    kind,
    target,
    state,
    late,
    replay,
    fingerprint,
    attempt,
    deadline,
    created,
    updated,
    url: `${URL}/effects/${id}/`,
  };
}

/** Why the server would reject this event (its error and fields); null when it takes it. */
function eventProblem(event: unknown): { error: string; fields: Record<string, string> } | null {
  if (!event || typeof event !== "object" || Array.isArray(event)) {
    return { error: "An event must be an object", fields: { "": "Expected an object" } };
  }
  const given = event as Json;
  const requires = typeof given.type === "string" ? EVENT_REQUIRES[given.type] : undefined;
  if (requires === undefined) return { error: "Unknown event type", fields: { type: "Expected 'run' or 'span'" } };
  const fields: Record<string, string> = {};
  for (const name of ["id", ...requires]) if (!(name in given)) fields[name] = "This field is required";
  return Object.keys(fields).length ? { error: "Invalid event", fields } : null;
}

/** The server's 400 for a body without a field it requires or with one it does not take. */
function refused(path: string, body: unknown): Response | null {
  if (!body || typeof body !== "object" || Array.isArray(body)) {
    return { status: 400, body: { error: "The body must be a JSON object", fields: { body: "Expected an object" } } };
  }
  const [required, optional] = TAKES[path] as [string[], string[]];
  const fields: Record<string, string> = {};
  for (const name of required) if (!(name in body)) fields[name] = "This field is required";
  for (const name of Object.keys(body)) {
    if (!required.includes(name) && !optional.includes(name)) fields[name] = "Unknown field";
  }
  return Object.keys(fields).length ? { status: 400, body: { error: "Invalid request", fields } } : null;
}

/** A decimal's digits without trailing zeros: "50.00" is "50", as the server answers it. */
function normalise(value: string): string {
  const text = String(value).trim();
  if (!text.includes(".")) return text.replace(/^(-?)0+(?=\d)/, "$1");
  return text
    .replace(/0+$/, "")
    .replace(/\.$/, "")
    .replace(/^(-?)0+(?=\d)/, "$1");
}

function amountOf(amount: Json | null | undefined): Json | null {
  if (!amount) return null;
  return { value: normalise(amount.value), currency: amount.currency };
}

function grantOf(id: number, amount: Json | null | undefined): Json {
  return {
    id,
    name: `grant ${id}`,
    version: 1,
    currency: amount ? amount.currency : "",
    max_amount: null,
    max_daily_amount: null,
    targets: ["*"],
    url: `${URL}/authority/grants/${id}/`,
  };
}

/** What an intent claims besides its request, as the server compares it. */
function claimOf(intent: Json): Json {
  const amount = amountOf(intent.amount);
  return {
    kind: intent.kind,
    target: intent.target,
    authority: intent.authority ?? null,
    amount: amount ? `${amount.value} ${amount.currency}` : null,
  };
}

function fingerprintOf(value: unknown): string {
  return fingerprint(value);
}

/** A `Tallybook` whose server is a `FakeServer` (`tb.fake`), with a spool of its own. */
export class FakeTallybook extends Tallybook {
  readonly fake: FakeServer;
  private ownSpool: string | null = null;

  constructor(fake?: FakeServer, options: TallybookOptions = {}) {
    super({ url: URL, apiKey: "tb_fake", ...options });
    this.fake = fake ?? new FakeServer();
  }

  protected override configure(): Config {
    // A spool of its own unless told (two clients on one spool: a process and the next),
    // removed by close().
    this.ownSpool = this.options.spool === undefined ? mkdtempSync(path.join(tmpdir(), "tallybook-fake-")) : null;
    const spool = new Spool(this.ownSpool ?? (this.options.spool as string));
    return {
      channel: this.fake,
      spool,
      failOpen: this.options.failOpen ?? false,
      intentBudgetMs: intentBudgetMs(this.options),
    };
  }

  override async close(timeoutMs = 5000): Promise<void> {
    await super.close(timeoutMs);
    if (this.ownSpool !== null) rmSync(this.ownSpool, { recursive: true, force: true });
  }
}
