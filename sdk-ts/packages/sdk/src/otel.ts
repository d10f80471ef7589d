/**
 * The trace and span ids of the span current where an effect is recorded, through
 * `@opentelemetry/api` when the application has it (an optional peer dependency): nothing is
 * required, nothing is loaded unless it is installed.
 */

import { createRequire } from "node:module";

interface OtelApi {
  trace: { getActiveSpan(): { spanContext(): { traceId: string; spanId: string } } | undefined };
}

let api: OtelApi | null | undefined;

function load(): OtelApi | null {
  if (api === undefined) {
    api = null;
    // An optional peer: resolved from this package (installed beside it), else from the
    // application's folder.
    for (const from of [import.meta.url, `${process.cwd()}/`]) {
      try {
        api = createRequire(from)("@opentelemetry/api") as OtelApi;
        break;
      } catch {
        // not there
      }
    }
  }
  return api;
}

/** The current span's trace and span ids, or nulls. */
export function currentIds(): [string | null, string | null] {
  const span = load()?.trace.getActiveSpan();
  if (span === undefined) return [null, null];
  const { traceId, spanId } = span.spanContext();
  return [traceId, spanId];
}
