/**
 * HTTP to the Tallybook API over the global fetch: a timeout on every call, and retries with
 * exponential backoff and jitter on connection errors, 429 and 5xx only (honouring
 * Retry-After). Every request the SDK makes is safe to repeat: intents are idempotent on the
 * key and the worker, receipts on (key, system, external_id), failures on the state they reach.
 */

import { ServerUnavailable } from "./errors.js";

export interface Response {
  status: number;
  // biome-ignore lint/suspicious/noExplicitAny: JSON as the API answers it
  body: any;
}

/** How often and how patiently a request is repeated. */
export class Retry {
  constructor(
    readonly retries = 5,
    readonly backoffMs = 250,
    readonly maxBackoffMs = 30_000,
  ) {}

  /** Equal jitter: half the exponential step fixed, half random; at least Retry-After. */
  delay(retry: number, retryAfterMs: number | null = null): number {
    const step = Math.min(this.maxBackoffMs, this.backoffMs * 2 ** retry);
    let wait = step / 2 + Math.random() * (step / 2);
    if (retryAfterMs !== null) wait = Math.max(wait, retryAfterMs);
    return Math.min(wait, this.maxBackoffMs);
  }
}

export const NO_RETRY = new Retry(0);

/** What the client needs of a server: a Transport, or the testing module's fake. */
export interface Channel {
  readonly url: string;
  readonly timeoutMs: number;
  readonly retry: Retry;
  request(
    method: string,
    path: string,
    body?: unknown,
    options?: { retry?: Retry; budgetMs?: number },
  ): Promise<Response>;
}

/** Milliseconds from a Retry-After header: delta-seconds or an HTTP date. */
export function retryAfter(value: string | null): number | null {
  if (!value) return null;
  const trimmed = value.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed) * 1000;
  const when = Date.parse(trimmed);
  return Number.isNaN(when) ? null : Math.max(0, when - Date.now());
}

export const sleep = (ms: number): Promise<void> => new Promise((done) => setTimeout(done, ms));

/** JSON client of one Tallybook server. */
export class Transport implements Channel {
  readonly url: string;
  private readonly headers: Record<string, string>;

  constructor(
    url: string,
    apiKey: string,
    readonly timeoutMs: number,
    readonly retry: Retry,
    userAgent: string,
  ) {
    let parsed: URL | null = null;
    try {
      parsed = new URL(url);
    } catch {
      parsed = null;
    }
    if (parsed === null || !["http:", "https:"].includes(parsed.protocol)) {
      throw new TypeError(`Tallybook URL must be http(s)://host[:port][/path], not ${url}`);
    }
    this.url = url.replace(/\/+$/, "");
    this.headers = {
      Authorization: `Bearer ${apiKey}`,
      "Content-Type": "application/json",
      Accept: "application/json",
      "User-Agent": userAgent,
    };
  }

  /**
   * Send one request, retrying what is worth retrying; 4xx answers are returned. `budgetMs`
   * caps the milliseconds of all tries together, waits and pauses included.
   */
  async request(
    method: string,
    path: string,
    body?: unknown,
    options: { retry?: Retry; budgetMs?: number } = {},
  ): Promise<Response> {
    const retry = options.retry ?? this.retry;
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const deadline = options.budgetMs === undefined ? null : Date.now() + options.budgetMs;
    const left = (): number =>
      deadline === null ? this.timeoutMs : Math.max(1, Math.min(this.timeoutMs, deadline - Date.now()));
    for (let attempt = 0; ; attempt++) {
      let problem: string;
      let wait: number | null = null;
      try {
        const answer = await fetch(this.url + path, {
          method,
          headers: this.headers,
          body: payload,
          signal: AbortSignal.timeout(left()),
        });
        const text = await answer.text();
        if (answer.status !== 429 && answer.status < 500) {
          return { status: answer.status, body: decode(text) };
        }
        problem = `HTTP ${answer.status}`;
        wait = retryAfter(answer.headers.get("Retry-After"));
      } catch (error) {
        const cause = (error as { cause?: { code?: string } }).cause;
        problem = `${(error as Error).name}: ${(error as Error).message}${cause?.code ? ` (${cause.code})` : ""}`;
      }
      const pause = retry.delay(attempt, wait);
      if (attempt >= retry.retries || (deadline !== null && deadline - Date.now() <= pause)) {
        throw new ServerUnavailable(`${method} ${this.url}${path} failed after ${attempt + 1} tries: ${problem}`);
      }
      await sleep(pause);
    }
  }
}

function decode(text: string): unknown {
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    // Not the API talking (a proxy's error page, a wrong URL): say what came back.
    return { error: `a non-JSON answer: ${JSON.stringify(text.slice(0, 200))}` };
  }
}
