/**
 * `@tallybook/pi` in the real Pi (each session its own Node 22 process, `pi-agent.ts`), against
 * the live server that pytest gives (tests/sdk/test_typescript.py): the extension is loaded
 * from a file as a user's is, and the model (pi-ai's faux provider) asks for a bash command
 * that pays an invoice by appending to ledger.txt.
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import type { ExtensionAPI } from "@earendil-works/pi-coding-agent";
import { Tallybook } from "@tallybook/sdk";
import { FakeTallybook } from "@tallybook/sdk/testing";
import { type PiEffect, tallybook } from "../src/index.js";

const LIVE = process.env.TALLYBOOK_TEST_LIVE === "1";
const HERE = path.dirname(fileURLToPath(import.meta.url));
const AGENT = path.join(HERE, "pi-agent.js");
const EXTENSION = path.join(HERE, "..", "src", "index.js");
const PAY = "echo paid >> ledger.txt && echo receipt-42";

interface Session {
  status: number | null;
  signal: NodeJS.Signals | null;
  sessionId?: string;
  told: string[];
  stderr: string;
}

/** A project with the extension file a user writes (configuration plus two lines). */
function project(): { dir: string; sessions: string; extension: string } {
  const dir = mkdtempSync(path.join(tmpdir(), "tallybook-pi-"));
  const extension = path.join(dir, "tallybook.ts");
  writeFileSync(
    extension,
    `import { tallybook } from ${JSON.stringify(EXTENSION)};\n` +
      "export default tallybook({\n" +
      '  effects: [{ tool: "bash", match: /ledger/, kind: "payment", target: "ledger",\n' +
      '              receipt: ({ text }) => ({ system: "ledger", externalId: text.trim() }) }],\n' +
      "});\n",
  );
  return { dir, sessions: path.join(dir, "sessions"), extension };
}

function session(p: ReturnType<typeof project>, command: string, resume: boolean): Session {
  const done = spawnSync(
    process.execPath,
    [AGENT, JSON.stringify({ project: p.dir, sessions: p.sessions, extension: p.extension, command, resume })],
    {
      cwd: p.dir,
      encoding: "utf8",
      timeout: 60_000,
      // Offline: no catalog refresh, version check or install telemetry.
      env: { ...process.env, PI_OFFLINE: "1", PI_SKIP_VERSION_CHECK: "1", PI_TELEMETRY: "0" },
    },
  );
  const last = done.stdout.trim().split("\n").at(-1);
  const out = last?.startsWith("{") ? JSON.parse(last) : { told: [] };
  return { status: done.status, signal: done.signal, stderr: done.stderr, ...out };
}

function ledger(p: ReturnType<typeof project>): string[] {
  const file = path.join(p.dir, "ledger.txt");
  return existsSync(file) ? readFileSync(file, "utf8").trim().split("\n") : [];
}

/** The effect's key: the tool, the run (Pi's session) and the input's fingerprint. */
function keyOf(sessionId: string, command: string): string {
  return `bash:${sessionId}:${createHash("sha256").update(JSON.stringify({ command })).digest("hex").slice(0, 32)}`;
}

/** The run's status on the server (Pi's session is the run), asked of pytest's hands. */
async function runStatus(runId: string): Promise<string> {
  const answer = await fetch(process.env.TALLYBOOK_TEST_OPERATOR as string, {
    method: "POST",
    body: JSON.stringify({ run: runId }),
  });
  assert.equal(answer.status, 200);
  return ((await answer.json()) as { status: string }).status;
}

async function operator(key: string, what: string): Promise<void> {
  const answer = await fetch(process.env.TALLYBOOK_TEST_OPERATOR as string, {
    method: "POST",
    body: JSON.stringify({ key, what }),
  });
  assert.equal(answer.status, 200, await answer.text());
}

describe("the Pi extension in the real Pi", { skip: !LIVE && "needs the live server (pytest)" }, () => {
  const tb = new Tallybook();

  test("the call is an effect with its receipt; asked again in the session it is told completed", async () => {
    const p = project();
    const first = session(p, PAY, false);
    assert.equal(first.status, 0, first.stderr);
    assert.deepEqual(
      first.told.map((text) => text.trim()),
      ["receipt-42"],
    );
    const key = keyOf(first.sessionId as string, PAY);
    assert.equal(await runStatus(first.sessionId as string), "ok"); // the session ended its run
    const status = await tb.status(key);
    assert.equal(status.state, "succeeded");
    assert.equal(status.receipts[0]?.externalId, "receipt-42");
    assert.equal(status.effect.kind, "payment");

    const again = session(p, PAY, true);
    assert.equal(again.sessionId, first.sessionId);
    assert.equal(again.told.length, 1);
    assert.match(
      again.told[0] as string,
      /^Already done \(Tallybook\): .* \(receipt ledger:receipt-42\)\. Do not repeat/,
    );
    assert.deepEqual(ledger(p), ["paid"]);
  });

  test("Pi killed between the command and its receipt leaves an uncertain case; the next session does not repeat it", async () => {
    const p = project();
    // The command pays, then kills Pi (its parent) before Pi sees the result.
    const crash = "echo paid >> ledger.txt && kill -9 $PPID";
    const killed = session(p, crash, false);
    assert.equal(killed.signal, "SIGKILL", killed.stderr);
    assert.deepEqual(ledger(p), ["paid"]);

    const resumed = session(p, crash, true);
    assert.equal(resumed.status, 0, resumed.stderr);
    assert.equal(resumed.told.length, 1);
    const told = resumed.told[0] as string;
    assert.match(told, /^Not performed \(Tallybook\): .*: wait\. /);
    assert.match(told, /Case #\d+ \(uncertain\): http:\/\/\S+\/cases\/\d+\//);
    assert.deepEqual(ledger(p), ["paid"]);
    const status = await tb.status(keyOf(resumed.sessionId as string, crash));
    assert.equal(status.state, "timed_out");
    assert.deepEqual(
      status.cases.map((c) => c.reason),
      ["uncertain"],
    );
  });

  test("a denied call's reason reaches the model", async () => {
    const p = project();
    const first = session(p, PAY, false);
    assert.equal(first.status, 0, first.stderr);
    await operator(keyOf(first.sessionId as string, PAY), "abandon");
    const denied = session(p, PAY, true);
    assert.equal(denied.told.length, 1);
    assert.match(denied.told[0] as string, /^Not performed \(Tallybook\): .*: denied\. \S/);
    assert.deepEqual(ledger(p), ["paid"]);
  });
});

test("the extension's effects are checked when it is made: each mistake names the entry and the field", () => {
  const mistakes: Array<[unknown, RegExp]> = [
    [{ tool: "bash", replay: "always" }, /effects\[0\] \(bash\): replay "always" must be one of never, safe/],
    [
      { tool: "bash", key: "deploy:{cmd}" },
      /effects\[0\] \(bash\): key .* names cmd, which the tool's input does not have \(it has command, timeout\)/,
    ],
    [{ tool: "bash", receipt: "id" }, /effects\[0\] \(bash\): receipt "id" must be a function of the result/],
    [{ tool: "bash", match: "git push" }, /effects\[0\] \(bash\): match must be a RegExp/],
    [{ tool: "bash", definitiveOnError: "yes" }, /effects\[0\] \(bash\): definitiveOnError must be true or false/],
    [{ tool: "bash", kind: 3 }, /effects\[0\] \(bash\): kind 3 must be a non-empty string/],
    [{ tool: "bash", taget: "git" }, /effects\[0\] \(bash\): unknown option\(s\) taget/],
    [{ kind: "deploy" }, /effects\[0\]: tool must be the tool's name/],
  ];
  for (const [declared, told] of mistakes) {
    assert.throws(() => tallybook({ effects: [declared as PiEffect] }), told);
  }
  // Right: a built-in tool's fields, the run, and another extension's tool (its input unknown).
  tallybook({
    effects: [
      { tool: "bash", match: /\bgit push\b/, key: "push:{command}:{runId}", replay: "never", kind: "deploy" },
      { tool: "deploy_app", key: "deploy:{app}", receipt: () => null },
    ],
  });
});

/** The part of Pi's extension runtime the extension uses: its handlers, and an event's emission. */
function runtime() {
  const handlers = new Map<string, (event: unknown, ctx?: unknown) => Promise<unknown>>();
  const api = { on: (name: string, handler: never) => handlers.set(name, handler) } as unknown as ExtensionAPI;
  const emit = (name: string, event: unknown, ctx?: unknown) =>
    (handlers.get(name) as NonNullable<ReturnType<typeof handlers.get>>)(event, ctx);
  return { api, emit };
}

async function payOnce(pi: ReturnType<typeof runtime>, session: string, command: string): Promise<unknown> {
  const ctx = { sessionManager: { getSessionId: () => session } };
  const toolCallId = `call-${session}`;
  const answer = await pi.emit("tool_call", { toolName: "bash", toolCallId, input: { command } }, ctx);
  await pi.emit("tool_result", { toolCallId, content: [{ type: "text", text: "paid" }], details: {}, isError: false });
  return answer;
}

test("a session replaced by a new one leaves the client working for the next session, and the caller's client open", async () => {
  const tb = new FakeTallybook();
  const extension = tallybook({ effects: [{ tool: "bash" }], tb });
  const first = runtime();
  extension(first.api);
  assert.equal(await payOnce(first, "s1", "pay 1"), undefined);
  await first.emit("session_shutdown", { type: "session_shutdown", reason: "new" });

  // Pi's next session is a new extension runtime: the factory is called again.
  const second = runtime();
  extension(second.api);
  assert.equal(await payOnce(second, "s2", "pay 2"), undefined);
  await second.emit("session_shutdown", { type: "session_shutdown", reason: "quit" });

  const states = [...tb.fake.effects.values()].map((effect) => effect.state);
  assert.deepEqual(states, ["succeeded", "succeeded"]);
  await tb.close();
});
