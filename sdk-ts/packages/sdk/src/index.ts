export {
  type Amount,
  checkEffect,
  DEFAULT_URL,
  Effect,
  type EffectCheck,
  type EffectOptions,
  REPLAY_POLICIES,
  type ReceiptFields,
  type ReplayPolicy,
  type RunOptions,
  run,
  Tallybook,
  type TallybookOptions,
  TOOL_OPTIONS,
  type ToolDeclaration,
  type ToolOptions,
  VERSION,
} from "./client.js";
export {
  EffectConflict,
  EffectDenied,
  EffectInDoubt,
  EffectInterrupted,
  EffectUnsettled,
  IntentNotRecorded,
  ReceiptConflict,
  RequestRejected,
  ServerUnavailable,
  TallybookError,
} from "./errors.js";
export type { Case, EffectStatus, Json, Receipt } from "./records.js";
export { canonical, fingerprint, KEY_FINGERPRINT } from "./records.js";
export { currentRun } from "./scope.js";
