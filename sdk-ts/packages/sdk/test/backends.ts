/**
 * Where the suites run: the fake always; the live server too when pytest started one and gave
 * its URL and an API key (tests/sdk/test_typescript.py), with an operator's hands there (an
 * endpoint of the pytest process that settles an effect as a person at the desk would).
 */

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import type { Config } from "../src/client.js";
import { Tallybook } from "../src/index.js";
import { FakeTallybook } from "../src/testing.js";
import { type Channel, NO_RETRY, type Response, Transport } from "../src/transport.js";

export type Verdict = "not_happened" | "happened" | "abandon";

export interface Backend {
  name: string;
  tb: Tallybook;
  operator(key: string, what: Verdict): Promise<void>;
  state(key: string): Promise<string>;
  /** Two grants' ids (the fake grants any). */
  grants: [number, number];
  /** The API itself, as the client speaks to it (no retries). */
  api: Channel;
  close(): Promise<void>;
}

/** Quick retries, so that a test of a server that is away takes a second, not a minute. */
export const FAST = { retries: 2, backoffMs: 50, maxBackoffMs: 500, timeoutMs: 5000 };
/**
 * The live server may answer slowly on a loaded machine: a generous wait per request and an
 * intent budget of $TALLYBOOK_INTENT_BUDGET (30 s under pytest), else 30 s.
 */
export const LIVE_CLIENT = {
  ...FAST,
  timeoutMs: 30_000,
  intentBudgetMs: Number(process.env.TALLYBOOK_INTENT_BUDGET || 30) * 1000,
};

const made: string[] = [];
process.on("exit", () => {
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

/** A spool folder of the test's own, removed when the suite ends. */
export function spoolRoot(): string {
  const dir = mkdtempSync(path.join(tmpdir(), "tallybook-ts-test-"));
  made.push(dir);
  return dir;
}

export function fake(): Backend {
  const tb = new FakeTallybook();
  return {
    name: "fake",
    tb,
    async operator(key, what) {
      if (what === "abandon") tb.fake.abandon(key);
      else tb.fake.settle(key, what === "happened");
    },
    async state(key) {
      return tb.fake.state(key);
    },
    grants: [1, 2],
    api: tb.fake,
    close: () => tb.close(),
  };
}

export const LIVE = process.env.TALLYBOOK_TEST_LIVE === "1";

export function live(): Backend {
  const operatorUrl = process.env.TALLYBOOK_TEST_OPERATOR as string;
  const grants = (process.env.TALLYBOOK_TEST_GRANTS ?? "0,0").split(",").map(Number) as [number, number];
  const tb = new Tallybook({ spool: spoolRoot(), ...LIVE_CLIENT });
  return {
    name: "server",
    tb,
    async operator(key, what) {
      const answer = await fetch(operatorUrl, { method: "POST", body: JSON.stringify({ key, what }) });
      if (answer.status !== 200) throw new Error(`the operator could not ${what} ${key}: ${await answer.text()}`);
    },
    async state(key) {
      return (await tb.status(key)).state;
    },
    grants,
    api: new Transport(
      process.env.TALLYBOOK_URL as string,
      process.env.TALLYBOOK_API_KEY as string,
      30_000,
      NO_RETRY,
      "tests",
    ),
    close: () => tb.close(),
  };
}

/** The backends to run a table against: the fake, and the live server when there is one. */
export function backends(): Array<() => Backend> {
  return LIVE ? [fake, live] : [fake];
}

/** What the client speaks to (the fake, or the Transport to the live server), configured. */
export function channelOf(tb: Tallybook): Channel {
  return (tb as unknown as { configured(): Config }).configured().channel;
}

export interface Sent {
  path: string;
  body: unknown;
  status: number | null;
}

/**
 * Put `between` between the client and its server: it is given each request and the server's
 * own `request`, and answers in its place (or throws, as a transport does). What was sent, and
 * the status it had back (null: none came), is recorded in the list returned.
 */
export function intercept(
  tb: Tallybook,
  between?: (path: string, body: unknown, send: () => Promise<Response>) => Promise<Response>,
): Sent[] {
  const channel = channelOf(tb);
  const send = channel.request.bind(channel);
  const sent: Sent[] = [];
  channel.request = async (method, path, body, options) => {
    const seen: Sent = { path, body, status: null };
    sent.push(seen);
    const forward = () => send(method, path, body, options);
    const answer = await (between ? between(path, body, forward) : forward());
    seen.status = answer.status;
    return answer;
  };
  return sent;
}
