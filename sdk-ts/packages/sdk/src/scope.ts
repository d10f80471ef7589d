/**
 * The run an effect belongs to, and the context it runs under, for the code running now: kept
 * in an AsyncLocalStorage, set by `tb.run()` and `tb.context()`, so it follows awaits, timers
 * and promises started inside.
 */

import { AsyncLocalStorage } from "node:async_hooks";
import { type Json, withoutNull } from "./records.js";

export interface Scope {
  runId: string | null;
  toolCallId: string | null;
  context: Json;
}

const OUTSIDE: Scope = { runId: null, toolCallId: null, context: {} };
const storage = new AsyncLocalStorage<Scope>();

export function current(): Scope {
  return storage.getStore() ?? OUTSIDE;
}

/** The id of the run given to the innermost `tb.run(...)` around this code, if any. */
export function currentRun(): string | null {
  return current().runId;
}

/** Run `fn` in the current scope with these ids, and the context added to. */
export function entered<T>(ids: { runId?: string | null; toolCallId?: string | null }, context: Json, fn: () => T): T {
  const now = current();
  return storage.run(
    {
      runId: ids.runId || now.runId,
      toolCallId: ids.toolCallId || now.toolCallId,
      context: { ...now.context, ...withoutNull(context) },
    },
    fn,
  );
}
