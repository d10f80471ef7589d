/**
 * Tallybook, the client. It records an intent before each effect and waits for the answer,
 * within a budget of a couple of seconds; receipts and failures are written to the local spool
 * (see `spool.ts`) and sent in the background, so none is lost and none makes the agent wait.
 * Nothing is read from the environment, and nothing touches the disk or the network, until the
 * client is first used.
 */

import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import * as path from "node:path";
import {
  EffectInDoubt,
  EffectUnsettled,
  IntentNotRecorded,
  interruption,
  ReceiptConflict,
  RequestRejected,
  ServerUnavailable,
  TallybookError,
} from "./errors.js";
import { currentIds } from "./otel.js";
import {
  type EffectStatus,
  iso8601,
  type Json,
  type Receipt,
  receiptFrom,
  statusFrom,
  withoutNull,
} from "./records.js";
import * as scope from "./scope.js";
import { defaultRoot, type Entry, Spool, spoolDir } from "./spool.js";
import { type Channel, NO_RETRY, Retry, sleep, Transport } from "./transport.js";

export const VERSION = "0.1.0";
export const DEFAULT_URL = "http://127.0.0.1:8000";
const MAX_ERROR = 4000; // what the server keeps of a failure's error
/**
 * The spooled reports the sender sends in batches (`POST /api/v1/<endpoint>/batch`), as the
 * Python SDK does, and the most a batch holds (the server's MAX_BATCH).
 */
export const BATCHED = ["receipts", "failures"];
export const BATCH_ITEMS = 100;
const APPROVAL = "approval_required";
const UNCERTAIN = "uncertain";
/** A tool's result larger than this (as JSON) is not kept with its receipt; the receipt is. */
export const MAX_RESULT = 256 * 1024;

export type ReplayPolicy = "never" | "safe" | "idempotent" | "reconcile";

/** What an effect moves, for its grant's limits: `{ value: "12.50", currency: "EUR" }`. */
export interface Amount {
  value: string;
  currency: string;
}

// biome-ignore lint/suspicious/noExplicitAny: any error class
type ErrorClass = new (...args: any[]) => unknown;

/** What an effect declares besides its key and request. */
export interface ToolOptions {
  kind: string;
  target: string;
  /** What a crashed attempt means when asked again (`never` by default). */
  replay?: ReplayPolicy;
  /** Seconds the effect may take before the server treats it as timed out. */
  timeoutSeconds?: number;
  authority?: Json | null;
  amount?: Amount | null;
  /** Milliseconds to wait for a person's approval when the grant requires one. */
  waitForApprovalMs?: number;
  /** Milliseconds to wait, when the effect is in doubt, for a person or a reconciler. */
  waitInDoubtMs?: number;
  /** Asked once when the effect is in doubt: the provider's receipt if it did happen. */
  onInDoubt?: (report: EffectInDoubt) => Receipt | null | undefined | Promise<Receipt | null | undefined>;
  /** Errors that mean the provider did nothing: classes, or a test of the error. */
  definitiveOn?: ErrorClass[] | ((error: unknown) => boolean);
  /** Perform the effect even when its intent cannot be recorded (harmless effects only). */
  failOpen?: boolean;
}

export interface EffectOptions extends ToolOptions {
  request?: unknown;
  fingerprint?: string;
  toolCallId?: string;
}

export const TOOL_OPTIONS = [
  "kind",
  "target",
  "replay",
  "timeoutSeconds",
  "authority",
  "amount",
  "waitForApprovalMs",
  "waitInDoubtMs",
  "onInDoubt",
  "definitiveOn",
  "failOpen",
];
const EFFECT_OPTIONS = [...TOOL_OPTIONS, "request", "fingerprint", "toolCallId"];

/** The options are typed; a typo in plain JavaScript must fail too, not be dropped. */
export function checkOptions(options: object, known: string[]): void {
  const unknown = Object.keys(options).filter((name) => !known.includes(name));
  if (unknown.length) throw new TypeError(`unknown effect option(s): ${unknown.sort().join(", ")}`);
  const given = options as Json;
  const missing = ["kind", "target"].filter((name) => !given[name]);
  if (missing.length) throw new TypeError(`an effect needs ${missing.join(" and ")}`);
  if (given.onInDoubt !== undefined && typeof given.onInDoubt !== "function") {
    throw new TypeError("onInDoubt must be a function of the EffectInDoubt report");
  }
  for (const name of ["waitForApprovalMs", "waitInDoubtMs", "timeoutSeconds"]) {
    if (given[name] !== undefined && typeof given[name] !== "number") {
      throw new TypeError(`${name} must be a number, not ${JSON.stringify(given[name])}`);
    }
  }
}

const TEMPLATE_FIELD = /\{([^{}]*)\}/g;
export const REPLAY_POLICIES: readonly ReplayPolicy[] = ["never", "safe", "idempotent", "reconcile"];

export interface EffectCheck {
  /** The option names the declaration may have: an unknown one (a typo) is refused. */
  known?: readonly string[];
  /** The tool's input fields, when its schema says them: a key template naming another is refused. */
  params?: readonly string[] | null;
  /** How the receipt may be read: a function of the result, or also a field name ("id"). */
  receipt?: "function" | "field or function";
}

/**
 * Refuse a tool's declaration that would fail only once its effect happened (`durableTool()`,
 * `@tallybook/pi`'s `effects`), as Python's `check_effect`: a TypeError naming the entry
 * (`where`) and the field, when the declaration is made.
 */
export function checkEffect(declared: object, where: string, check: EffectCheck = {}): void {
  const given = declared as Json;
  const wrong = (field: string, what: string) =>
    new TypeError(`${where}: ${field} ${JSON.stringify(given[field]) ?? String(given[field])} ${what}`);
  if (check.known) {
    const unknown = Object.keys(given).filter((name) => !check.known?.includes(name));
    if (unknown.length) throw new TypeError(`${where}: unknown option(s) ${unknown.sort().join(", ")}`);
  }
  for (const name of ["kind", "target"]) {
    if (given[name] !== undefined && (typeof given[name] !== "string" || !given[name])) {
      throw wrong(name, "must be a non-empty string");
    }
  }
  if (given.replay !== undefined && !REPLAY_POLICIES.includes(given.replay)) {
    throw wrong("replay", `must be one of ${REPLAY_POLICIES.join(", ")}`);
  }
  const key = given.key;
  if (key !== undefined && typeof key !== "function") {
    if (typeof key !== "string" || !key) throw wrong("key", "must be a template of the input or a function of it");
    for (const [, name] of key.matchAll(TEMPLATE_FIELD)) {
      const head = (name ?? "").split(".")[0] ?? "";
      if (!head) throw wrong("key", "names an empty field: {} must name one");
      if (check.params && !check.params.includes(head) && head !== "runId" && head !== "toolCallId") {
        throw wrong("key", `names ${head}, which the tool's input does not have (it has ${check.params.join(", ")})`);
      }
    }
  }
  const receipt = given.receipt;
  if (receipt !== undefined && typeof receipt !== "function") {
    const field = check.receipt === "field or function";
    if (!field || typeof receipt !== "string" || !receipt) {
      throw wrong(
        "receipt",
        field ? "must be the result's field with the provider's id, or a function" : "must be a function of the result",
      );
    }
  }
  for (const name of ["timeoutSeconds", "waitForApprovalMs", "waitInDoubtMs"]) {
    if (given[name] !== undefined && (typeof given[name] !== "number" || !(given[name] > 0))) {
      throw wrong(name, "must be a positive number");
    }
  }
  if (given.onInDoubt !== undefined && typeof given.onInDoubt !== "function") {
    throw wrong("onInDoubt", "must be a function of the EffectInDoubt report");
  }
  const rule = given.definitiveOn;
  if (
    rule !== undefined &&
    typeof rule !== "function" &&
    !(Array.isArray(rule) && rule.every((c) => typeof c === "function"))
  ) {
    throw wrong("definitiveOn", "must be a list of error classes or a test of the error");
  }
  if (given.failOpen !== undefined && typeof given.failOpen !== "boolean")
    throw wrong("failOpen", "must be true or false");
}

export interface ReceiptFields {
  system: string;
  externalId: string;
  /** A Date, epoch milliseconds or an ISO 8601 string. */
  observedAt?: Date | number | string | null;
  data?: unknown;
}

export interface TallybookOptions {
  /** $TALLYBOOK_URL, else http://127.0.0.1:8000 */
  url?: string;
  /** $TALLYBOOK_API_KEY */
  apiKey?: string;
  /** $TALLYBOOK_SPOOL_DIR, else ~/.cache/tallybook/spool */
  spool?: string;
  timeoutMs?: number;
  retries?: number;
  backoffMs?: number;
  maxBackoffMs?: number;
  /**
   * The most an intent may take, every try and pause included, before IntentNotRecorded:
   * $TALLYBOOK_INTENT_BUDGET (seconds), else 2000 ms.
   */
  intentBudgetMs?: number;
  failOpen?: boolean;
  /** This process's identity (host:pid:random by default). */
  worker?: string;
}

export interface RunOptions {
  workflow: string;
  version?: string;
  /** A stable id (a ticket id, a job id), so that a restarted process resumes the run. */
  runId?: string;
  [context: string]: unknown;
}

export interface Config {
  channel: Channel;
  spool: Spool;
  failOpen: boolean;
  intentBudgetMs: number;
}

/** One effect block, `fx`: the intent's answer, and how to report the outcome. */
export class Effect {
  decision: string | null = null;
  reason: string | null = null;
  effect: Json | null = null;
  attempt: number | null = null;
  /** The effect was done before: skip it; `stored` is its receipt. */
  completed = false;
  /** The intent is on record (false when it ran unrecorded, `failOpen`). */
  recorded = false;
  /** The receipt on record, or the one this block sent. */
  stored: Receipt | null = null;
  settled: "receipt" | "failure" | null = null;

  constructor(
    private readonly tb: Tallybook,
    readonly key: string,
  ) {}

  /** The effect's page for an operator. */
  get url(): string | null {
    return this.effect ? (this.effect.url as string) : null;
  }

  /**
   * The effect happened: record its receipt. Written to the spool (fsynced) before this
   * returns, and sent in the background; the receipt returned is the one sent.
   */
  receipt(fields: ReceiptFields): Receipt {
    const body = receiptBody(this.key, fields, this.attempt);
    const known = this.stored;
    if (known !== null && known.system === body.system && known.externalId === body.external_id) {
      return known;
    }
    this.oneOutcome(`a receipt ${body.system}:${body.external_id}`);
    this.settled = "receipt";
    this.stored = {
      system: body.system,
      externalId: body.external_id,
      observedAt: body.observed_at ?? null,
      data: fields.data ?? null,
      key: this.key,
      attempt: this.attempt,
    };
    this.tb.record("receipts", body);
    return this.stored;
  }

  /** The effect failed; `definitive: true` when the provider said nothing happened. */
  fail(error: unknown, options: { definitive?: boolean } = {}): void {
    this.oneOutcome("a failure");
    this.settled = "failure";
    this.tb.record("failures", failureBody(this.key, error, options.definitive ?? false));
  }

  private oneOutcome(what: string): void {
    if (this.stored === null && this.settled === null) return;
    const had = this.stored ? `receipt ${this.stored.system}:${this.stored.externalId}` : "failure";
    throw new ReceiptConflict(
      `'${this.key}' already has its ${had}; ${what} was not sent. One block is one effect: if the ` +
        `provider really did it twice, report the second with tb.receipt('${this.key}', ...), ` +
        "which records it as a duplicate effect.",
    );
  }

  /** Take the intent's answer: carry on, or throw the interruption report. */
  answered(answer: Json | null): void {
    if (answer === null) {
      this.decision = "unrecorded";
      return;
    }
    this.decision = answer.decision;
    this.reason = answer.reason;
    this.effect = answer.effect;
    this.attempt = answer.effect?.attempt ?? null;
    const report = interruption(this.key, answer);
    if (report !== null) throw report;
    this.recorded = true;
    if (answer.decision === "completed") {
      this.completed = true;
      this.stored = answer.receipt ? receiptFrom(answer.receipt) : null;
    }
  }
}

export function receiptBody(key: string, fields: ReceiptFields, attempt: number | null): Json {
  if (!fields.system || fields.externalId === undefined || fields.externalId === null || fields.externalId === "") {
    throw new TypeError("a receipt needs a system and an externalId");
  }
  const [traceId, spanId] = currentIds();
  return withoutNull({
    key,
    system: fields.system,
    external_id: String(fields.externalId),
    observed_at: iso8601(fields.observedAt),
    data: fields.data,
    attempt,
    trace_id: traceId,
    span_id: spanId,
  });
}

function failureBody(key: string, error: unknown, definitive: boolean): Json {
  const text = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  return { key, error: text.slice(0, MAX_ERROR) || "failed", definitive };
}

function isDefinitive(options: ToolOptions, error: unknown): boolean {
  const rule = options.definitiveOn;
  if (rule === undefined) return false;
  if (typeof rule === "function") return rule(error);
  return rule.some((cls) => error instanceof cls);
}

/**
 * The most an intent may take: the option, else $TALLYBOOK_INTENT_BUDGET (seconds, as the
 * Python SDK's hooks and MCP tools read it), else 2 s.
 */
export function intentBudgetMs(given: TallybookOptions): number {
  if (given.intentBudgetMs !== undefined) return given.intentBudgetMs;
  const seconds = process.env.TALLYBOOK_INTENT_BUDGET;
  if (!seconds) return 2000;
  const parsed = Number(seconds);
  if (!Number.isFinite(parsed) || parsed <= 0) {
    throw new TallybookError(`TALLYBOOK_INTENT_BUDGET=${seconds}: seconds, a positive number`);
  }
  return parsed * 1000;
}

function newWorker(): string {
  return `${hostname()}:${process.pid}:${randomBytes(4).toString("hex")}`;
}

function rejected(status: number, body: unknown): RequestRejected {
  if (body && typeof body === "object") {
    const b = body as Json;
    return new RequestRejected(status, String(b.error ?? JSON.stringify(b)), b.fields ?? {});
  }
  return new RequestRejected(status, String(body));
}

interface ItemResult {
  status: number;
  body?: unknown;
}

/** A multi-status answer's results, one an item in order; null when it has not `count` of them. */
function itemResults(body: unknown, count: number): ItemResult[] | null {
  const results = body && typeof body === "object" ? (body as Json).results : undefined;
  if (!Array.isArray(results) || results.length !== count) return null;
  const fine = results.every((r) => r && typeof r === "object" && Number.isInteger(r.status));
  return fine ? (results as ItemResult[]) : null;
}

/** An item's status that says "not now" rather than "never": it is sent again. */
function transient(status: number): boolean {
  return status === 429 || status >= 500;
}

function itemsLater(endpoint: string, later: number, of: number): ServerUnavailable {
  return new ServerUnavailable(`${later} of ${of} ${endpoint} could not be taken now; they stay in the spool`);
}

/**
 * Effects inside `fn` belong to this run, whichever client records them; `fn` is given its id.
 * Give a stable `runId` (a ticket id, a job id) so that a restarted process resumes the run.
 */
export function run<T>(options: RunOptions, fn: (runId: string) => T): T {
  const { workflow, version, runId, ...context } = options;
  const id = runId || randomBytes(16).toString("hex");
  return scope.entered({ runId: id }, { ...context, workflow, workflow_version: version }, () => fn(id));
}

/**
 * The Tallybook client; one per process is plenty. `url` and `apiKey` default to
 * $TALLYBOOK_URL and $TALLYBOOK_API_KEY, `spool` to $TALLYBOOK_SPOOL_DIR, all read at first use.
 */
export class Tallybook {
  private config: Config | null = null;
  readonly worker: string;
  private sending: Promise<void> | null = null;
  private again = false;
  private closed = false;
  private failing = false;
  private readonly inFlight = new Map<string, Promise<void>>();
  private interrupt: (() => void) | null = null;
  /** The server answered a batch 404 (or 405): an older one, sent one by one from then on. */
  private noBatches = false;

  constructor(protected readonly options: TallybookOptions = {}) {
    this.worker = options.worker ?? newWorker();
  }

  /** The configuration, read (from the options, else the environment) at first use. */
  protected configured(): Config {
    if (this.config === null) {
      this.config = this.configure();
      if (this.config.spool.pending().length) this.wake(); // what an earlier process left
    }
    return this.config;
  }

  protected configure(): Config {
    const given = this.options;
    const url = given.url || process.env.TALLYBOOK_URL || DEFAULT_URL;
    const apiKey = given.apiKey || process.env.TALLYBOOK_API_KEY;
    if (!apiKey) throw new TallybookError("No API key: pass apiKey or set TALLYBOOK_API_KEY");
    const retry = new Retry(given.retries ?? 5, given.backoffMs ?? 250, given.maxBackoffMs ?? 30_000);
    const channel = new Transport(
      url,
      apiKey,
      given.timeoutMs ?? 10_000,
      retry,
      `tallybook-typescript/${VERSION} node/${process.versions.node}`,
    );
    const root = given.spool ?? defaultRoot();
    return {
      channel,
      spool: new Spool(spoolDir(path.resolve(root), channel.url, apiKey)),
      failOpen: given.failOpen ?? false,
      intentBudgetMs: intentBudgetMs(given),
    };
  }

  get url(): string {
    return this.configured().channel.url;
  }

  get spool(): Spool {
    return this.configured().spool;
  }

  // -- the run context ------------------------------------------------------------------------

  /** Effects inside `fn` belong to this run; `fn` is given its id. */
  run<T>(options: RunOptions, fn: (runId: string) => T): T {
    return run(options, fn);
  }

  /** Add to the context every intent inside carries; `toolCallId` names the call. */
  context<T>(options: { toolCallId?: string; [context: string]: unknown }, fn: () => T): T {
    const { toolCallId, ...context } = options;
    return scope.entered({ toolCallId: toolCallId ?? null }, context, fn);
  }

  /** The id of the run given to the innermost `tb.run(...)` around this code, if any. */
  currentRun(): string | null {
    return scope.currentRun();
  }

  // -- effects --------------------------------------------------------------------------------

  /**
   * Make one external effect durable. The intent is recorded before `body` runs; `body`
   * performs the effect and calls `fx.receipt(...)` (or `fx.fail(...)`), or skips it when
   * `fx.completed`. Throws `EffectInDoubt`, `EffectDenied`, `EffectConflict` or
   * `IntentNotRecorded` instead of running `body` when the effect must not be performed.
   */
  async effect<T>(key: string, options: EffectOptions, body: (fx: Effect) => T | Promise<T>): Promise<T> {
    checkOptions(options, EFFECT_OPTIONS);
    const fx = new Effect(this, key);
    const intent = this.intentBody(key, options);
    let answer = await this.intent(key, intent, options.failOpen);
    let probed = false;
    let waited = false;
    while (answer !== null && answer.decision === "wait") {
      const reason = answer.case?.reason;
      let patience: number | undefined;
      if (reason === UNCERTAIN && options.onInDoubt && !probed) {
        probed = true;
        const found = await options.onInDoubt(interruption(key, answer) as EffectInDoubt);
        if (!found) continue;
        this.record("receipts", receiptBody(key, found, answer.effect.attempt));
      } else {
        patience = waited ? undefined : reason === APPROVAL ? options.waitForApprovalMs : options.waitInDoubtMs;
        waited = true;
        if (patience === undefined) break;
        // Settled (or decided) in time: ask again, and the answer says how.
        await this.waitFor(key, { timeoutMs: patience });
      }
      answer = await this.intent(key, intent, options.failOpen);
    }
    fx.answered(answer);
    let result: T;
    try {
      result = await body(fx);
    } catch (error) {
      if (!fx.completed && fx.settled === null) {
        this.record("failures", failureBody(key, error, isDefinitive(options, error)));
      }
      throw error;
    }
    if (!fx.completed && fx.settled === null) {
      const unsettled = new EffectUnsettled(
        `The effect block for '${key}' was left with neither a receipt nor a failure; call ` +
          "fx.receipt(...) after the effect or fx.fail(...) when it did not happen. Tallybook now " +
          "treats its outcome as unknown.",
      );
      this.record("failures", failureBody(key, unsettled, false));
      throw unsettled;
    }
    return result;
  }

  /**
   * A tool function that performs an effect; the call returns its result. The key is a
   * template of the arguments' fields ("refund:{order}", which may also name {runId} and
   * {toolCallId}) or a function of the arguments; the request is the arguments, or what
   * `request` makes of them. The receipt is the result itself (a Receipt), the result's field
   * `receipt` names, or what the function `receipt` makes of it. An effect already done is not
   * repeated: the call returns the result it had then.
   */
  tool<A extends Json, R, Rest extends unknown[] = []>(
    key: string | ((args: A) => string),
    options: ToolDeclaration<A, R>,
    fn: (args: A, ...rest: Rest) => R | Promise<R>,
  ): (args: A, ...rest: Rest) => Promise<R> {
    const { request, receipt, ...effectOptions } = options;
    checkOptions(effectOptions, TOOL_OPTIONS);
    if (receipt !== undefined && typeof receipt !== "string" && typeof receipt !== "function") {
      throw new TypeError("receipt must be the result's field name or a function of the result");
    }
    return async (args: A, ...rest: Rest): Promise<R> => {
      const effectKey = toolKey(key, args);
      const body = request ? request(args) : args;
      return this.effect(effectKey, { ...effectOptions, request: body }, async (fx) => {
        if (fx.completed) return replayed(fx.stored, receipt !== undefined) as R;
        const result = await fn(args, ...rest);
        const [fields, problem] = evidence(result, receipt, options.target);
        fx.receipt(fields);
        if (problem !== null) throw problem;
        return result;
      });
    };
  }

  /**
   * Record a receipt outside an effect block: one that arrives later (a webhook). Spooled and
   * sent in the background, like every receipt.
   */
  receipt(key: string, fields: ReceiptFields & { attempt?: number | null }): Receipt {
    const body = receiptBody(key, fields, fields.attempt ?? null);
    this.record("receipts", body);
    return {
      system: body.system,
      externalId: body.external_id,
      observedAt: body.observed_at ?? null,
      data: fields.data ?? null,
      key,
      attempt: fields.attempt ?? null,
    };
  }

  /** The effect as the server sees it now (recording nothing). */
  async status(key: string): Promise<EffectStatus> {
    const response = await this.configured().channel.request("GET", `/api/v1/effects?key=${encodeURIComponent(key)}`);
    if (response.status !== 200) throw rejected(response.status, response.body);
    return statusFrom(response.body);
  }

  /**
   * Poll until the effect's decision is no longer `wait` (a person settled its case). Throws
   * EffectInDoubt when it still is after `timeoutMs`.
   */
  async waitFor(key: string, options: { timeoutMs?: number; pollMs?: number } = {}): Promise<EffectStatus> {
    const timeoutMs = options.timeoutMs ?? 300_000;
    let poll = options.pollMs ?? 1000;
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const status = await this.status(key);
      if (status.decision !== "wait") return status;
      const left = deadline - Date.now();
      if (left <= 0) {
        const open = status.cases.find((c) => c.reason === UNCERTAIN) ?? status.cases[0] ?? null;
        throw new EffectInDoubt(
          key,
          status.decision,
          `Still waiting after ${timeoutMs / 1000} s: ${status.reason}`,
          status.effect,
          open,
        );
      }
      await sleep(Math.min(poll, left));
      poll = Math.min(poll * 1.5, 10_000);
    }
  }

  /** Wait until every spooled receipt and failure is delivered; whether they are. */
  async flush(timeoutMs = 10_000): Promise<boolean> {
    return this.flushWithin(timeoutMs, false);
  }

  /** Deliver what the spool holds (unless the server is away), then stop sending. */
  async close(timeoutMs = 5000): Promise<void> {
    if (this.config === null) return;
    await this.flushWithin(timeoutMs, true);
    this.closed = true;
    this.interrupt?.();
    await this.sending;
    const left = this.config.spool.pending().length;
    if (left) console.warn(`${left} Tallybook event(s) wait in ${this.config.spool.directory} for the next client`);
  }

  // -- talking to the server ------------------------------------------------------------------

  private intentBody(key: string, options: EffectOptions): Json {
    const now = scope.current();
    const [traceId, spanId] = currentIds();
    return withoutNull({
      key,
      kind: options.kind,
      target: options.target,
      request: options.request,
      fingerprint: options.fingerprint,
      replay: options.replay ?? "never",
      timeout_s: options.timeoutSeconds,
      run_id: now.runId,
      tool_call_id: options.toolCallId ?? now.toolCallId,
      trace_id: traceId,
      span_id: spanId,
      worker: this.worker,
      context: Object.keys(now.context).length ? now.context : null,
      authority: options.authority,
      amount: options.amount,
    });
  }

  /** Record an intent; the answer, or null when the server is away and we fail open. */
  private async intent(key: string, body: Json, failOpen: boolean | undefined): Promise<Json | null> {
    const config = this.configured();
    const deadline = Date.now() + config.intentBudgetMs;
    let response: { status: number; body: Json };
    try {
      // This effect's spooled events go first: its receipt must not arrive after a later
      // intent for it, which would be answered as if it had none.
      for (const entry of config.spool.pendingFor(key)) {
        // The sender may be sending it right now (alone or in a batch): that first.
        await this.inFlight.get(entry.path)?.catch(() => undefined);
        if (config.spool.read(entry.path) === null) continue; // delivered, or set aside
        try {
          await this.deliverOnce(entry, undefined, deadline - Date.now());
        } catch (error) {
          if (!(error instanceof RequestRejected)) throw error;
        }
      }
      response = await config.channel.request("POST", "/api/v1/intents", body, {
        budgetMs: Math.max(1, deadline - Date.now()),
      });
    } catch (error) {
      if (!(error instanceof ServerUnavailable)) throw error;
      if (!(failOpen ?? config.failOpen)) throw new IntentNotRecorded(key, error);
      console.warn(`Tallybook is away; '${key}' runs unrecorded (failOpen): ${error.message}`);
      this.record("intents", body);
      return null;
    }
    if (![200, 201, 409].includes(response.status)) {
      throw new IntentNotRecorded(key, rejected(response.status, response.body));
    }
    return response.body;
  }

  /**
   * Say how a run goes, as Python's `run_event`: `running` when it starts, `ok` or `error`
   * when it ends. Spooled and sent in the background like a receipt, so the run does not
   * read `running` for ever and the agent never waits for it.
   */
  runEvent(
    runId: string,
    status: "running" | "ok" | "error",
    fields: { workflow?: string; agent?: string; error?: unknown } = {},
  ): void {
    const now = new Date().toISOString();
    const [traceId] = currentIds();
    const event = withoutNull({
      type: "run",
      id: `run:${runId}:${status}:${randomBytes(8).toString("hex")}`,
      run_id: runId,
      agent: fields.agent,
      workflow: fields.workflow ?? fields.agent,
      status,
      trace_ids: traceId ? [traceId] : null,
      attributes: fields.error === undefined ? null : { error: String(fields.error).slice(0, MAX_ERROR) },
      [status === "running" ? "started" : "ended"]: now,
    });
    this.record("events", { events: [event] });
  }

  /** Spool an event (fsynced) for the background sender; returns at once. */
  record(endpoint: string, body: Json): void {
    this.configured().spool.put(endpoint, body);
    this.wake();
  }

  private wake(): void {
    this.again = true;
    if (this.sending === null && !this.closed) {
      this.sending = this.sendLoop().finally(() => {
        this.sending = null;
      });
    }
  }

  /** Deliver what the spool holds, backing off (unref'd) while the server is away. */
  private async sendLoop(): Promise<void> {
    const { channel, spool } = this.configured();
    let failures = 0;
    while (!this.closed) {
      this.again = false;
      try {
        await this.sendPending();
        failures = 0;
      } catch (error) {
        if (!(error instanceof ServerUnavailable)) console.error("Tallybook spool delivery failed", error);
        failures += 1;
      }
      this.failing = failures > 0;
      if (!failures && !this.again && !spool.pending().length) return;
      if (failures) await this.pause(channel.retry.delay(Math.min(failures, 16)));
    }
  }

  /**
   * One pass of the sender: the spool's events oldest first, each tried once; runs of receipts
   * (or of failures) go in batches of up to BATCH_ITEMS, in the spool's order. An event this
   * client is sending already (an intent sends its key's first) is waited for, not sent again.
   */
  private async sendPending(): Promise<void> {
    const { spool } = this.configured();
    const elsewhere: Promise<void>[] = [];
    let batch: Entry[] = [];
    for (const file of spool.pending()) {
      const sending = this.inFlight.get(file);
      if (sending !== undefined) {
        elsewhere.push(sending.catch(() => undefined));
        continue;
      }
      const entry = spool.read(file);
      if (entry === null) continue;
      const first = batch[0];
      if (first !== undefined && (entry.endpoint !== first.endpoint || batch.length === BATCH_ITEMS)) {
        await this.deliverBatch(batch);
        batch = [];
      }
      if (BATCHED.includes(entry.endpoint) && !this.noBatches) {
        batch.push(entry);
        continue;
      }
      try {
        await this.deliverOnce(entry, NO_RETRY);
      } catch (error) {
        if (!(error instanceof RequestRejected)) throw error;
      }
    }
    if (batch.length) await this.deliverBatch(batch);
    await Promise.all(elsewhere);
  }

  /**
   * Send one endpoint's entries in one request; each leaves the spool once its own result says
   * the server has it, as the Python SDK's sender does. A server without the batch route (404,
   * 405), or one that refuses the batch whole, gets them one by one. An item the server could
   * not take now (429, 5xx) stays, and the pass ends as if the server were away.
   */
  private async deliverBatch(collected: Entry[]): Promise<void> {
    // One an intent began to send meanwhile (its key's events go first) is its to finish.
    const entries = collected.filter((entry) => !this.inFlight.has(entry.path));
    const [only] = entries;
    if (only === undefined || entries.length === 1) {
      try {
        if (only !== undefined) await this.deliverOnce(only, NO_RETRY);
      } catch (error) {
        if (!(error instanceof RequestRejected)) throw error;
      }
      return;
    }
    const sending = this.sendBatch(entries).finally(() => {
      for (const entry of entries) this.inFlight.delete(entry.path);
    });
    for (const entry of entries) this.inFlight.set(entry.path, sending);
    await sending;
  }

  private async sendBatch(entries: Entry[]): Promise<void> {
    const { channel } = this.configured();
    const endpoint = (entries[0] as Entry).endpoint;
    // A lost answer (a connection reset, a timeout) leaves every entry in the spool: sent
    // again, each is answered as recorded before.
    const response = await channel.request(
      "POST",
      `/api/v1/${endpoint}/batch`,
      { [endpoint]: entries.map((entry) => entry.body) },
      { retry: NO_RETRY },
    );
    const results = response.status === 207 ? itemResults(response.body, entries.length) : null;
    if (results === null) {
      if ([404, 405].includes(response.status)) this.noBatches = true;
      for (const entry of entries) {
        try {
          await this.deliver(entry, NO_RETRY);
        } catch (error) {
          if (!(error instanceof RequestRejected)) throw error;
        }
      }
      return;
    }
    const later = entries.filter(
      (entry, n) => !this.settled(entry, (results[n] as ItemResult).status, results[n]?.body),
    );
    if (later.length) throw itemsLater(endpoint, later.length, entries.length);
  }

  /** A backoff pause that does not keep the process alive, and that close() cuts short. */
  private pause(ms: number): Promise<void> {
    return new Promise<void>((done) => {
      const timer = setTimeout(done, ms).unref();
      this.interrupt = () => {
        clearTimeout(timer);
        done();
      };
    }).finally(() => {
      this.interrupt = null;
    });
  }

  /** Send one spooled event, unless this client is sending it already. */
  private deliverOnce(entry: Entry, retry?: Retry, budgetMs?: number): Promise<void> {
    let sending = this.inFlight.get(entry.path);
    if (sending === undefined) {
      sending = this.deliver(entry, retry, budgetMs).finally(() => this.inFlight.delete(entry.path));
      this.inFlight.set(entry.path, sending);
    }
    return sending;
  }

  private async deliver(entry: Entry, retry?: Retry, budgetMs?: number): Promise<void> {
    const { channel } = this.configured();
    const response = await channel.request("POST", `/api/v1/${entry.endpoint}`, entry.body, {
      retry,
      budgetMs: budgetMs === undefined ? undefined : Math.max(1, budgetMs),
    });
    if (response.status === 207) {
      // Events are answered one result each: the entry is delivered once every one is.
      const events = Array.isArray(entry.body.events) ? entry.body.events.length : 0;
      const results = itemResults(response.body, events);
      if (results === null) throw new ServerUnavailable(`an answer to ${entry.endpoint} without its results`);
      const later = results.filter((result) => transient(result.status)).length;
      if (later) throw itemsLater(entry.endpoint, later, results.length);
      const refused = results.find((result) => result.status >= 300);
      if (refused === undefined) {
        this.configured().spool.done(entry);
        return;
      }
      this.settled(entry, refused.status, response.body);
      throw rejected(refused.status, refused.body ?? refused);
    }
    if (this.settled(entry, response.status, response.body)) return;
    if (transient(response.status)) throw new ServerUnavailable(`${entry.endpoint}: HTTP ${response.status}`);
    throw rejected(response.status, response.body);
  }

  /**
   * Act on the server's answer to one entry (alone, or its result in a batch): done with it
   * (the server has it, or settled the effect some other way first), set aside as refused
   * (false), or kept for the next pass when the server could not take it now (false).
   */
  private settled(entry: Entry, status: number, body: unknown): boolean {
    const { spool } = this.configured();
    if (status < 300 || (entry.endpoint === "intents" && status === 409)) {
      spool.done(entry);
      return true;
    }
    if (entry.endpoint === "failures" && [404, 409].includes(status)) {
      // The server settled the effect some other way first; it knows better.
      console.warn(`Tallybook did not apply the failure of '${entry.body.key}': ${JSON.stringify(body)}`);
      spool.done(entry);
      return true;
    }
    if (transient(status)) return false;
    spool.reject(entry, JSON.stringify(body));
    return false;
  }

  private async flushWithin(timeoutMs: number, unlessAway: boolean): Promise<boolean> {
    const spool = this.configured().spool;
    const deadline = Date.now() + timeoutMs;
    while (spool.pending().length && Date.now() < deadline) {
      if (unlessAway && this.failing) break;
      this.wake();
      await sleep(Math.min(20, Math.max(1, deadline - Date.now())));
    }
    return spool.pending().length === 0;
  }
}

/** How a tool's arguments become its key and its result a receipt. */
export interface ToolDeclaration<A, R> extends ToolOptions {
  request?: (args: A) => unknown;
  /** The result's field holding the external id, or a function of the result. */
  receipt?: string | ((result: R) => ReceiptFields);
}

/** The key for these arguments: a template's fields filled in, or the key function's answer. */
export function toolKey<A extends Json>(key: string | ((args: A) => string), args: A): string {
  if (typeof key === "function") return key(args);
  const now = scope.current();
  const ids: Json = { runId: now.runId, toolCallId: now.toolCallId };
  return key.replace(TEMPLATE_FIELD, (_, name: string) => {
    if (!name) throw new TypeError(`the key template ${JSON.stringify(key)} must name its fields`);
    const [head, ...path] = name.split(".");
    let value: unknown = head !== undefined && head in args ? args[head] : head ? ids[head] : undefined;
    if (value === undefined || value === null) {
      if (head === "runId" || head === "toolCallId") {
        throw new TallybookError(
          `The key ${JSON.stringify(key)} names {${head}}, but none is current: call it inside ` +
            "tb.run(...) (and tb.context({ toolCallId }, ...) for a tool call)",
        );
      }
      throw new TypeError(`the key ${JSON.stringify(key)} names ${head}, which the arguments lack`);
    }
    for (const part of path) value = (value as Json)[part];
    return typeof value === "object" ? JSON.stringify(value) : String(value);
  });
}

function isReceipt(value: unknown): value is ReceiptFields {
  return typeof value === "object" && value !== null && "system" in value && "externalId" in value;
}

/** `fx.receipt`'s fields for a tool's result, and the error to throw once it is sent. */
export function evidence<R>(
  result: R,
  receipt: string | ((result: R) => ReceiptFields) | undefined,
  system: string,
): [ReceiptFields, Error | null] {
  if (receipt === undefined) {
    if (!isReceipt(result)) {
      throw new TypeError("the tool must return a Receipt ({ system, externalId }), or declare receipt:");
    }
    return [result, null];
  }
  let made: ReceiptFields;
  if (typeof receipt === "string") {
    const id = result && typeof result === "object" ? (result as Json)[receipt] : undefined;
    if (id === undefined || id === null || id === "") {
      throw new TypeError(`the result has no '${receipt}' to take the receipt's externalId from`);
    }
    made = { system, externalId: String(id) };
  } else {
    made = receipt(result);
  }
  const kept: Json = { result };
  if (made.data !== undefined && made.data !== null) kept.data = made.data;
  let size: number;
  try {
    size = JSON.stringify(kept)?.length ?? 0;
  } catch (error) {
    // The effect happened: its receipt is sent all the same, then the bug is reported.
    return [
      { ...made },
      new TypeError(`The tool's result is not JSON (${(error as Error).message}); its receipt was recorded without it`),
    ];
  }
  if (size > MAX_RESULT) {
    console.warn(`A tool's result (${size} bytes) is not kept with its receipt`);
    return [{ ...made }, null];
  }
  return [{ ...made, data: kept }, null];
}

/** What a call returns for an effect done before: the result it returned then, else the Receipt. */
export function replayed(stored: Receipt | null, keepsResult: boolean): unknown {
  if (stored === null) throw new TallybookError("the effect is completed, but no receipt came with the answer");
  const data = stored.data as Json | null;
  if (keepsResult && data && typeof data === "object" && "result" in data) return data.result;
  return stored;
}
