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
    try {
      // Resolved from the application's folder, as its own import would be.
      const require = createRequire(`${process.cwd()}/`);
      api = require("@opentelemetry/api") as OtelApi;
    } catch {
      api = null;
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
