/** What the server answers, as plain records, and the ISO 8601 time the API speaks. */

// biome-ignore lint/suspicious/noExplicitAny: JSON as the API answers it
export type Json = Record<string, any>;

/** Evidence that an effect happened. */
export interface Receipt {
  system: string;
  externalId: string;
  observedAt?: string | null;
  data?: unknown;
  /** Set on the receipts the server has on record. */
  id?: number | null;
  key?: string | null;
  strength?: string | null;
  attempt?: number | null;
  late?: boolean;
  received?: string | null;
}

/** An entry in the reconciliation queue: what an operator settles. */
export interface Case {
  id: number;
  reason: string;
  severity: string;
  summary: string;
  url: string;
}

/** An effect as the server sees it now, and the decision an intent would get. */
export interface EffectStatus {
  decision: string;
  reason: string;
  state: string;
  effect: Json;
  receipts: Receipt[];
  cases: Case[];
}

export function receiptFrom(data: Json): Receipt {
  return {
    system: data.system,
    externalId: data.external_id,
    observedAt: data.observed_at ?? null,
    data: data.data ?? null,
    id: data.id ?? null,
    key: data.key ?? null,
    strength: data.strength ?? null,
    attempt: data.attempt ?? null,
    late: Boolean(data.late),
    received: data.received ?? null,
  };
}

export function caseFrom(data: unknown): Case | null {
  if (!data || typeof data !== "object") return null;
  const c = data as Json;
  return { id: c.id, reason: c.reason, severity: c.severity, summary: c.summary, url: c.url };
}

export function statusFrom(data: Json): EffectStatus {
  return {
    decision: data.decision,
    reason: data.reason,
    state: data.effect.state,
    effect: data.effect,
    receipts: (data.receipts ?? []).map(receiptFrom),
    cases: (data.cases ?? []).map(caseFrom).filter((c: Case | null) => c !== null),
  };
}

const ISO8601 = /^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?(Z|z|[+-]\d{2}(:?\d{2})?)?$/;

/** A Date or epoch milliseconds as ISO 8601; a string is checked. */
export function iso8601(value: Date | number | string | null | undefined): string | null {
  if (value === null || value === undefined) return null;
  if (typeof value === "string") {
    if (!ISO8601.test(value)) throw new TypeError(`observedAt must be an ISO 8601 time, not ${JSON.stringify(value)}`);
    return value;
  }
  if (value instanceof Date) return value.toISOString();
  if (typeof value === "number") return new Date(value).toISOString();
  throw new TypeError("observedAt must be a Date, epoch milliseconds or an ISO 8601 string");
}

/** The object without its null and undefined values. */
export function withoutNull(values: Json): Json {
  return Object.fromEntries(Object.entries(values).filter(([, v]) => v !== null && v !== undefined));
}

/** Sorted keys, no spaces: the canonical JSON both SDKs and the server fingerprint. */
export function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value && typeof value === "object") {
    const entries = Object.entries(value as Json).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonical(v)}`).join(",")}}`;
  }
  return JSON.stringify(value);
}
