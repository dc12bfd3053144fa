// The sidecar's MCP endpoint through the official MCP TypeScript SDK client
// (@modelcontextprotocol/sdk, Streamable HTTP). cmd/sidecar's
// TestMCPRealClient starts the sidecar (in front of a real llama-server),
// writes the memories this test recalls, and runs it with:
//
//   KVSIDECAR_MCP_URL     http://HOST:PORT/mcp
//   KVSIDECAR_MCP_KEY     the API key the sessions were written with
//   KVSIDECAR_MCP_CHAT    JSON {"user","old","new","solo"}: a user's two chat sessions, and a
//                         short session of no named user (its turns all still in the window)
//   KVSIDECAR_MCP_PLAN    JSON {"continuing":[session,user],"switching":[session,user]}:
//                         sessions holding plan.json's facts, one user each
//
// It prints one line "MCP_PLAN {json}" with the measured plan for the Go test.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const env = (name) => {
  const v = process.env[name];
  assert.ok(v, `${name} is not set: run this through cmd/sidecar's TestMCPRealClient`);
  return v;
};
const url = new URL(env("KVSIDECAR_MCP_URL"));
const key = env("KVSIDECAR_MCP_KEY");
const chat = JSON.parse(env("KVSIDECAR_MCP_CHAT"));
const planSessions = JSON.parse(env("KVSIDECAR_MCP_PLAN"));
const plan = JSON.parse(readFileSync(new URL("./plan.json", import.meta.url), "utf8"));

async function connect(headers) {
  const client = new Client({ name: "kvsidecar-mcp-test", version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(url, { requestInit: { headers } }));
  return client;
}

const as = (user, apiKey = key) => {
  const h = { Authorization: `Bearer ${apiKey}` };
  if (user) h["X-User-ID"] = user;
  return h;
};

async function recall(client, session_id, query) {
  const t0 = performance.now();
  const res = await client.callTool({ name: "session_recall", arguments: { query, session_id } });
  return { res, ms: performance.now() - t0 };
}

test("the tool is listed with its schemas", async () => {
  const client = await connect(as(chat.user));
  try {
    const { tools } = await client.listTools();
    assert.deepEqual(tools.map((t) => t.name), ["session_recall"]);
    const [t] = tools;
    assert.deepEqual([...t.inputSchema.required].sort(), ["query", "session_id"]);
    assert.ok(t.outputSchema && t.outputSchema.properties.memories, "an output schema");
    assert.equal(t.annotations?.readOnlyHint, true);
    assert.equal(client.getServerVersion()?.name, "kvsidecar");
  } finally {
    await client.close();
  }
});

test("a user's new session recalls the earlier chat session", async () => {
  const client = await connect(as(chat.user));
  try {
    const { res } = await recall(client, chat.new, "What is my greyhound called and which beach does he love?");
    assert.ok(!res.isError, JSON.stringify(res.content));
    const out = res.structuredContent;
    assert.equal(out.mode, "full");
    assert.equal(out.full_recall, true);
    const hit = out.memories.find((m) => m.text.includes("Brighton"));
    assert.ok(hit, `no memory of the earlier session: ${JSON.stringify(out.memories)}`);
    assert.equal(hit.other_session, true);
    assert.equal(hit.role, "user");
    assert.ok(hit.id && !Number.isNaN(Date.parse(hit.date)), JSON.stringify(hit));
    // The same text for models that read content only.
    assert.deepEqual(JSON.parse(res.content[0].text), out);

    const again = (await recall(client, chat.new, "Is my greyhound Comet happy at the beach in Brighton?")).res;
    assert.equal(again.structuredContent.mode, "reuse");
  } finally {
    await client.close();
  }
});

test("a short session finds what it said, still in the window, with no memory model", async () => {
  const own = await connect(as(""));
  try {
    for (const q of ["telescope name Orion balcony", "what is my telescope called"]) {
      const { res } = await recall(own, chat.solo, q);
      assert.ok(!res.isError, JSON.stringify(res.content));
      const hit = res.structuredContent.memories.find((m) => m.text.includes("Orion-1"));
      assert.ok(hit, `${q}: ${JSON.stringify(res.structuredContent)}`);
      assert.equal(hit.role, "user");
      assert.ok(!hit.other_session);
    }
    const { res } = await recall(own, chat.old, "telescope");
    assert.equal(res.isError, true, "a named user's session is not a session of no user");
  } finally {
    await own.close();
  }
  // Another key, or a named user, never finds it.
  for (const headers of [as("", "another-key"), as(chat.user)]) {
    const client = await connect(headers);
    try {
      const { res } = await recall(client, chat.solo, "telescope name Orion balcony");
      assert.equal(res.isError, true, JSON.stringify(headers));
      assert.match(res.content[0].text, /no session/);
    } finally {
      await client.close();
    }
  }
  // The user's own older session, asked from it: its turns in the window.
  const ada = await connect(as(chat.user));
  try {
    const { res } = await recall(ada, chat.old, "What am I allergic to?");
    assert.ok(res.structuredContent.memories.some((m) => m.text.includes("walnuts") && !m.other_session), JSON.stringify(res.structuredContent));
  } finally {
    await ada.close();
  }
});

test("another end user, another key or no user finds no session; no key is refused", async () => {
  for (const headers of [as("mallory"), as(chat.user, "another-key"), as("")]) {
    const client = await connect(headers);
    try {
      const { res } = await recall(client, chat.old, "What is my greyhound called?");
      assert.equal(res.isError, true, JSON.stringify(headers));
      assert.match(res.content[0].text, /no session/);
    } finally {
      await client.close();
    }
  }
  await assert.rejects(connect({}), /401|API key/);
  const client = await connect(as(chat.user));
  try {
    const { res } = await recall(client, chat.old, "   ");
    assert.equal(res.isError, true);
  } finally {
    await client.close();
  }
});

test("the design's test plan: full recalls on a continuing topic and at topic switches", async () => {
  const measure = async ([session, user], queries) => {
    const client = await connect(as(user));
    try {
      const modes = [];
      const ms = [];
      for (const q of queries) {
        const r = await recall(client, session, q);
        assert.ok(!r.res.isError, JSON.stringify(r.res.content));
        assert.ok(r.res.structuredContent.memories.length > 0, `nothing recalled for ${q}`);
        modes.push(r.res.structuredContent.mode);
        ms.push(r.ms);
      }
      return { modes, ms };
    } finally {
      await client.close();
    }
  };
  const full = (modes) => modes.filter((m) => m === "full").length;

  const cont = await measure(planSessions.continuing, plan.continuing);
  const sw = await measure(planSessions.switching, plan.switching.flatMap((b) => b.questions));
  const blocks = plan.switching.map((b, i) => {
    const modes = sw.modes.slice(5 * i, 5 * i + 5);
    return { topic: b.topic, full: full(modes), modes };
  });
  const ms = [...cont.ms, ...sw.ms].sort((a, b) => a - b);
  const report = {
    continuing: { messages: plan.continuing.length, full: full(cont.modes), modes: cont.modes },
    switching: { messages: sw.modes.length, topics: blocks.length, switches: blocks.length - 1, full: full(sw.modes), blocks },
    call_ms: { p50: ms[Math.floor(ms.length / 2)], max: ms[ms.length - 1] },
  };
  console.log("MCP_PLAN " + JSON.stringify(report));

  assert.ok(report.continuing.full >= 1 && report.continuing.full <= 2, `continuing topic: ${report.continuing.full} full recalls per 10 messages`);
  for (const b of blocks) assert.equal(b.modes[0], "full", `no full recall at the switch to ${b.topic}: ${b.modes}`);
  assert.ok(report.switching.full <= 2 * blocks.length, `${report.switching.full} full recalls for ${blocks.length} topics`);
});
