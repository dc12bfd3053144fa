package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kvsidecar/kvsidecar/mcpserver"
	"github.com/kvsidecar/kvsidecar/memory"
)

type addHeaders struct {
	h    map[string]string
	next http.RoundTripper
}

func (a addHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range a.h {
		r.Header.Set(k, v)
	}
	return a.next.RoundTrip(r)
}

// mcpRecall calls session_recall through the official Go client with the
// given headers and returns the structured answer, or the tool error's
// text.
func mcpRecall(t *testing.T, url string, hdr map[string]string, session, query string) (mode string, texts []string, toolErr string) {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "proxy-test", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url,
		HTTPClient: &http.Client{Transport: addHeaders{hdr, noPoolClient.Transport}}, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer cs.Close()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "session_recall",
		Arguments: map[string]any{"query": query, "session_id": session}})
	if err != nil {
		t.Fatalf("call: %v", err)
	}
	if res.IsError {
		return "", nil, res.Content[0].(*mcp.TextContent).Text
	}
	var out struct {
		Mode     string
		Memories []struct{ Text string }
	}
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	for _, m := range out.Memories {
		texts = append(texts, m.Text)
	}
	return out.Mode, texts, ""
}

// TestMCPRecallIsScopedLikeEveryRoute: /mcp answers the tool over the
// memory the chat path wrote, for the API key and end user of the request:
// a user's new session recalls the earlier one; another user of the key,
// another key, and a caller naming no user (for a named user's session)
// find no session; no key is 401 and a malformed user id 400, both in the
// OpenAI error shape; /metrics counts the calls.
func TestMCPRecallIsScopedLikeEveryRoute(t *testing.T) {
	up := newRecordingUpstream(t)
	st := openMemory(t, memory.Options{})
	ms, err := mcpserver.New(mcpserver.Options{Memory: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	base, srv := startSidecar(t, up.URL, func(o *Options) { o.Memory = st; o.MCP = ms })
	chat := func(session, user, text string) {
		t.Helper()
		hdr := map[string]string{"Authorization": "Bearer app-key", "X-Session-ID": session, "X-User-ID": user}
		if resp, b := post(t, base+"/v1/chat/completions", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, text), hdr); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", text, resp.StatusCode, b)
		}
		srv.waitIdle()
	}
	chat("ada-1", "ada", "My greyhound is called Comet and he loves the beach at Brighton.")
	chat("ada-1", "ada", "I am allergic to walnuts.")
	chat("ada-2", "ada", "hello again")
	if _, err := st.AddMemory(tenantOf([]byte("Bearer app-key")), "ada-2", memory.CategoryFact, "Ada's greyhound Comet is four years old.", 1); err != nil {
		t.Fatal(err)
	}

	url := base + "/mcp"
	ada := map[string]string{"Authorization": "Bearer app-key", "X-User-ID": "ada"}
	mode, texts, terr := mcpRecall(t, url, ada, "ada-2", "What is my greyhound called and which beach does he love?")
	all := strings.Join(texts, "\n")
	if terr != "" || mode != "full" || !strings.Contains(all, "Brighton") || !strings.Contains(all, "four years old") {
		t.Fatalf("ada's recall: %q %q %s", mode, texts, terr)
	}
	if mode, _, _ := mcpRecall(t, url, ada, "ada-2", "Is my greyhound Comet happy at the beach?"); mode != "reuse" {
		t.Fatalf("same topic: %q, want reuse", mode)
	}
	for _, hdr := range []map[string]string{
		{"Authorization": "Bearer app-key", "X-User-ID": "bob"},
		{"Authorization": "Bearer other-key", "X-User-ID": "ada"},
		{"Authorization": "Bearer app-key"},
	} {
		if _, texts, terr := mcpRecall(t, url, hdr, "ada-2", "What is my greyhound called?"); !strings.Contains(terr, "no session") || len(texts) > 0 {
			t.Fatalf("%v recalled ada's session: %q %q", hdr, texts, terr)
		}
	}

	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	for _, c := range []struct {
		hdr  map[string]string
		code int
	}{
		{map[string]string{}, 401},
		{map[string]string{"Authorization": "Bearer app-key", "X-User-ID": strings.Repeat("u", 300)}, 400},
	} {
		c.hdr["Content-Type"] = "application/json"
		c.hdr["Accept"] = "application/json, text/event-stream"
		resp, b := post(t, url, init, c.hdr)
		var e struct {
			Error struct{ Message, Type, Code string }
		}
		if resp.StatusCode != c.code || json.Unmarshal(b, &e) != nil || e.Error.Code == "" {
			t.Fatalf("%v: %d %s, want %d OpenAI-shaped", c.hdr, resp.StatusCode, b, c.code)
		}
	}

	resp, err := noPoolClient.Get(adminURL(t, base) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`sidecar_mcp_tool_calls_total{tool="session_recall",outcome="full"} 1`,
		`sidecar_mcp_tool_calls_total{tool="session_recall",outcome="reuse"} 1`,
		`sidecar_mcp_tool_calls_total{tool="session_recall",outcome="not_found"} 3`,
		`route="mcp",code="401"`,
	} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}
}

// TestMCPOffIs404: without Options.MCP the path is the sidecar's own and
// answers 404, never forwarded.
func TestMCPOffIs404(t *testing.T) {
	up := newRecordingUpstream(t)
	base, _ := startSidecar(t, up.URL, nil)
	resp, b := post(t, base+"/mcp", `{}`, map[string]string{"Authorization": "Bearer k", "Content-Type": "application/json"})
	if resp.StatusCode != 404 || !strings.Contains(string(b), "mcp_disabled") {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
}
