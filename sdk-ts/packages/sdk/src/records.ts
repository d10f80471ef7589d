/** What the server answers, as plain records, and the ISO 8601 time the API speaks. */

import { createHash } from "node:crypto";

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

/**
 * The canonical JSON both SDKs and the server fingerprint, as Python writes it
 * (`json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`): keys
 * sorted by code point, no spaces, text as it is (not escaped to ASCII), numbers as Python
 * prints them (an integral number as an integer, 1e-05 rather than 0.00001). A JavaScript
 * number cannot say whether it was `2` or `2.0` in the JSON it came from: it is `2`, as a
 * model's arguments parsed in Python are when written `2`.
 */
export function canonical(value: unknown): string {
  if (value === null || value === undefined) return "null";
  if (typeof value === "number") return pythonNumber(value);
  if (typeof value === "bigint") return value.toString();
  if (typeof value === "string" || typeof value === "boolean") return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map((v) => (typeof v === "function" ? "null" : canonical(v))).join(",")}]`;
  if (typeof value === "object") {
    const toJSON = (value as { toJSON?: () => unknown }).toJSON;
    if (typeof toJSON === "function") return canonical(toJSON.call(value));
    const entries = Object.entries(value as Json)
      .filter(([, v]) => v !== undefined && typeof v !== "function")
      .sort(([a], [b]) => byCodePoint(a, b));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonical(v)}`).join(",")}}`;
  }
  return JSON.stringify(String(value));
}

/** The hex of the fingerprint a default key keeps (`tool:run:fingerprint`), as Python's `default_key`. */
export const KEY_FINGERPRINT = 32;

/** SHA-256 of the value's canonical JSON, 64 hex: the server's own request fingerprint. */
export function fingerprint(value: unknown): string {
  return createHash("sha256").update(canonical(value), "utf8").digest("hex");
}

/**
 * A number as Python prints it: an integer as one (below 1e16, where a double is exact);
 * else as `repr` of a float, its shortest digits, in exponent form below 1e-4 or from 1e16.
 */
function pythonNumber(value: number): string {
  if (Number.isNaN(value)) return "NaN";
  if (!Number.isFinite(value)) return value > 0 ? "Infinity" : "-Infinity";
  const size = Math.abs(value);
  if (Number.isInteger(value) && size < 1e16) return String(value === 0 ? 0 : value);
  if (size >= 1e-4 && size < 1e16) return String(value);
  const [digits, exponent] = value.toExponential().split("e") as [string, string];
  const power = Number(exponent);
  return `${digits}e${power < 0 ? "-" : "+"}${String(Math.abs(power)).padStart(2, "0")}`;
}

/** Python's order of text: by code point (JavaScript's `<` compares UTF-16 units). */
function byCodePoint(a: string, b: string): number {
  const x = Array.from(a, (c) => c.codePointAt(0) as number);
  const y = Array.from(b, (c) => c.codePointAt(0) as number);
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    if (x[i] !== y[i]) return (x[i] as number) - (y[i] as number);
  }
  return x.length - y.length;
}
