/**
 * One Pi session, as a user runs it, for the tests: the real Pi (`createAgentSession`, its
 * extension loader and its bash tool) with pi-ai's faux provider scripting the model, which asks
 * for one bash command and then answers. The Tallybook extension is loaded from a file, as a
 * user's is. Prints what the model was told about its call, as JSON.
 *
 *     node pi-agent.js '{"project": …, "sessions": …, "extension": …, "command": …, "resume": true}'
 */

import * as path from "node:path";
import { fauxAssistantMessage, fauxProvider, fauxToolCall } from "@earendil-works/pi-ai";
import {
  createAgentSession,
  DefaultResourceLoader,
  ModelRuntime,
  SessionManager,
  SettingsManager,
} from "@earendil-works/pi-coding-agent";

const { project, sessions, extension, command, resume } = JSON.parse(process.argv[2] as string);
const agentDir = path.join(project, ".pi-agent");

const faux = fauxProvider();
const modelRuntime = await ModelRuntime.create({
  authPath: path.join(agentDir, "auth.json"),
  modelsPath: path.join(agentDir, "models.json"),
});
modelRuntime.registerNativeProvider(faux.provider);
const told: string[] = [];
faux.setResponses([
  fauxAssistantMessage([fauxToolCall("bash", { command })], { stopReason: "toolUse" }),
  (context) => {
    const last = context.messages.at(-1) as { role: string; content: Array<{ type: string; text?: string }> };
    told.push(last.content.map((part) => part.text ?? "").join("\n"));
    return fauxAssistantMessage("Done.");
  },
]);

const resourceLoader = new DefaultResourceLoader({
  cwd: project,
  agentDir,
  additionalExtensionPaths: [extension],
  noSkills: true,
  noPromptTemplates: true,
  noThemes: true,
  noContextFiles: true,
});
await resourceLoader.reload();
const sessionManager = resume
  ? SessionManager.continueRecent(project, sessions)
  : SessionManager.create(project, sessions);
const { session } = await createAgentSession({
  cwd: project,
  agentDir,
  model: faux.getModel(),
  thinkingLevel: "off",
  modelRuntime,
  resourceLoader,
  tools: ["bash"],
  sessionManager,
  settingsManager: SettingsManager.inMemory({ compaction: { enabled: false }, retry: { enabled: false } }),
});
try {
  await session.prompt("Pay the invoice in ledger.txt.");
} finally {
  // What Pi does when it quits (AgentSessionRuntime.dispose): the extensions hear the end.
  await session.extensionRunner.emit({ type: "session_shutdown", reason: "quit" });
  session.dispose();
}
console.log(JSON.stringify({ sessionId: sessionManager.getSessionId(), told }));
