// The Model Context Protocol's own TypeScript client against `lessons mcp` (stdio) and `/mcp`
// on `lessons serve` (streamable HTTP). Prints one JSON report; tests/it/mcp.rs checks it.
//
// node client.mjs LESSONS_BIN STORE_DIR MCP_URL WRITE_TOKEN READ_TOKEN
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [bin, store, url, writeToken, readToken] = process.argv.slice(2);
const run = { org: "acme", repo: "acme/app" };
const reply = JSON.stringify({
  facts: [
    { text: "PR 12 was merged", confidence: 0.9, audience: "repo" },
    { text: "check:deps-drift names any lockfile drift", confidence: 0.8, audience: "repo" },
  ],
});
const text = (result) => result.content?.[0]?.text;
const report = { stdio: {}, http: {} };

// Over stdio: the whole handshake, every tool, the prompt, a bad call.
{
  const transport = new StdioClientTransport({ command: bin, args: ["--store", store, "mcp"], stderr: "ignore" });
  const client = new Client({ name: "lessons-test", version: "1.0.0" });
  await client.connect(transport);
  report.stdio.tools = (await client.listTools()).tools.map((t) => t.name);
  report.stdio.context = text(await client.callTool({ name: "lessons_context", arguments: { ...run, brief: "add a drift check" } }));
  report.stdio.search = (await client.callTool({ name: "lessons_search", arguments: { scopeKey: "org:acme", query: "vitest node" } })).structuredContent;
  report.stdio.window = (await client.callTool({ name: "lessons_window", arguments: { scopeKey: "repo:acme/app" } })).structuredContent.records.length;
  report.stdio.gate = (await client.callTool({ name: "lessons_gate", arguments: { texts: ["PR 12 was merged", "run npm ci before the license check"] } })).structuredContent;
  const prompt = await client.getPrompt({ name: "lessons_reflection", arguments: { ...run, request: "fix the license check", answer: "npm ci fixed it" } });
  report.stdio.promptMessages = prompt.messages.length;
  const shown = prompt._meta?.["lessons/shown"] ?? [];
  report.stdio.reflect = text(await client.callTool({ name: "lessons_reflect", arguments: { ...run, reply, shown } }));
  try {
    await client.callTool({ name: "lessons_remember", arguments: { text: "x" } });
    report.stdio.unknownTool = "answered";
  } catch (e) {
    report.stdio.unknownTool = e.code;
  }
  await client.close();
}

// Over HTTP: the read token sees the read tools and is refused the write; the write token writes.
async function http(token) {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  const client = new Client({ name: "lessons-test", version: "1.0.0" });
  await client.connect(transport);
  return client;
}
{
  const reader = await http(readToken);
  report.http.readTools = (await reader.listTools()).tools.map((t) => t.name);
  const refused = await reader.callTool({ name: "lessons_reflect", arguments: { ...run, reply, shown: [] } });
  report.http.readReflect = refused.isError ? text(refused) : "written";
  await reader.close();
  const writer = await http(writeToken);
  const written = await writer.callTool({ name: "lessons_reflect", arguments: { ...run, reply, shown: [] } });
  report.http.writeReflectInserted = written.structuredContent.inserted;
  await writer.close();
  try {
    await http("not-a-token-0123456789");
    report.http.noToken = "connected";
  } catch (e) {
    report.http.noToken = e.code;
  }
}

console.log(JSON.stringify(report));
