#!/usr/bin/env node
// A minimal echo ACP agent on the ACP TypeScript SDK, for scripts/bench_hosted.
//
// Usage: node bench_echo_agent.mjs <path of the SDK's dist/acp.js>
// (scripts/test installs the SDK under .tools/node_modules/@agentclientprotocol/sdk).
//
// A prompt "stream N" is answered with N agent_message_chunk updates ("x ");
// any other prompt with one chunk holding its text. Every turn ends end_turn.
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const acp = await import(pathToFileURL(process.argv[2]).href);
let sessions = 0;

async function prompt(params, client) {
  const text = params.prompt.map((block) => block.text ?? "").join("");
  const match = /^stream (\d+)$/.exec(text);
  const chunks = match ? Number(match[1]) : 1;
  for (let i = 0; i < chunks; i++) {
    await client.notify(acp.methods.client.session.update, {
      sessionId: params.sessionId,
      update: {
        sessionUpdate: "agent_message_chunk",
        content: { type: "text", text: match ? "x " : text },
      },
    });
  }
  return { stopReason: "end_turn" };
}

acp
  .agent({ name: "bench-echo-agent" })
  .onRequest("initialize", () => ({
    protocolVersion: acp.PROTOCOL_VERSION,
    agentCapabilities: { loadSession: false },
  }))
  .onRequest("session/new", () => ({ sessionId: `echo-${sessions++}` }))
  .onRequest("session/prompt", (ctx) => prompt(ctx.params, ctx.client))
  .onNotification("session/cancel", () => {})
  .connect(acp.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin)));
