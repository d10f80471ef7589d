/** The errors an agent author handles: interruption reports and transport failures. */

import { type Case, caseFrom, type Json } from "./records.js";

/** Base of every error the SDK throws. */
export class TallybookError extends Error {
  override name = "TallybookError";
}

/** The server could not be reached, or kept answering 429/5xx, after every retry. */
export class ServerUnavailable extends TallybookError {
  override name = "ServerUnavailable";
}

/** The server refused a request (4xx): a bug in the caller, not worth a retry. */
export class RequestRejected extends TallybookError {
  override name = "RequestRejected";
  constructor(
    readonly status: number,
    readonly error: string,
    readonly fields: Record<string, string> = {},
  ) {
    const detail = Object.entries(fields)
      .map(([name, message]) => `${name}: ${message}`)
      .join("; ");
    super(`HTTP ${status}: ${error}${detail ? ` (${detail})` : ""}`);
  }
}

/** A block that has its outcome was given a different one: nothing was sent. */
export class ReceiptConflict extends TallybookError {
  override name = "ReceiptConflict";
}

/** An effect block was left with neither a receipt nor a failure: a bug in the agent. */
export class EffectUnsettled extends TallybookError {
  override name = "EffectUnsettled";
}

/**
 * Do not perform the effect now: the base of every such outcome, and its report. Carries the
 * decision, the one-sentence reason, the case an operator settles (if one is open) and its URL.
 */
export class EffectInterrupted extends TallybookError {
  override name = "EffectInterrupted";
  /** The case an operator settles, if one is open. */
  readonly case: Case | null;
  readonly caseUrl: string | null;
  constructor(
    readonly key: string,
    readonly decision: string,
    readonly reason: string,
    readonly effect: Json | null,
    opened: Case | null,
  ) {
    let report = `${key}: ${decision}. ${reason}`;
    if (opened !== null) report += ` Case #${opened.id} (${opened.reason}): ${opened.url}`;
    super(report);
    this.case = opened;
    this.caseUrl = opened?.url ?? null;
  }
}

/** The intent could not be recorded, so the effect was not performed (fail closed). */
export class IntentNotRecorded extends EffectInterrupted {
  override name = "IntentNotRecorded";
  readonly status: number | null;
  constructor(
    key: string,
    override readonly cause: ServerUnavailable | RequestRejected,
  ) {
    super(
      key,
      "unrecorded",
      `The intent could not be recorded, so the effect was not performed: ${cause.message}`,
      null,
      null,
    );
    this.status = cause instanceof RequestRejected ? cause.status : null;
  }
}

/** `wait`: the effect may have happened, or awaits a person; do not repeat it now. */
export class EffectInDoubt extends EffectInterrupted {
  override name = "EffectInDoubt";
}

/** `denied`: authority was refused, or an operator closed the effect. */
export class EffectDenied extends EffectInterrupted {
  override name = "EffectDenied";
}

/** `conflict`: the key was used before for a different request or claim. */
export class EffectConflict extends EffectInterrupted {
  override name = "EffectConflict";
}

const INTERRUPTIONS = { wait: EffectInDoubt, denied: EffectDenied, conflict: EffectConflict };

/** The error for the server's answer to an intent, or null when the effect may go ahead. */
export function interruption(key: string, answer: Json): EffectInterrupted | null {
  const decision = answer.decision as string;
  const Report = INTERRUPTIONS[decision as keyof typeof INTERRUPTIONS];
  if (Report === undefined) return null;
  return new Report(key, decision, answer.reason as string, (answer.effect as Json) ?? null, caseFrom(answer.case));
}
