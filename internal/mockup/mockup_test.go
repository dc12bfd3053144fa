package mockup

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

func serve(t *testing.T, o Options) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := New(o)
	go func() { _ = m.Serve(ln) }()
	t.Cleanup(func() { _ = m.Close() })
	return "http://" + ln.Addr().String()
}

func post(t *testing.T, url, session, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(body))
	if session != "" {
		req.Header.Set("X-Session-ID", session)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestDescribeAnswersWhatItReceived: with Describe, an answer (streamed
// or not) names the messages received, the newest quoted one per line.
func TestDescribeAnswersWhatItReceived(t *testing.T) {
	url := serve(t, Demo())
	body := `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"my name is Ada"},` +
		`{"role":"assistant","content":"` + describePrefix + ` I received 1 message"},{"role":"system","content":"Memory recalled:\n- likes Go"},{"role":"user","content":[{"type":"text","text":"what do I like?"}]}]`
	_, got := post(t, url, "s", body+`}`)
	var r struct {
		Choices []struct {
			Message struct{ Content string }
		}
	}
	if err := json.Unmarshal([]byte(got), &r); err != nil || len(r.Choices) != 1 {
		t.Fatalf("answer %s: %v", got, err)
	}
	text := r.Choices[0].Message.Content
	for _, want := range []string{"I received 5 messages (2 system, 2 user, 1 assistant); the newest 4:",
		"\n2. user: my name is Ada", "\n3. assistant: (an earlier answer of this demo upstream)", "\n4. system: Memory recalled: / - likes Go", "\n5. user: what do I like?"} {
		if !strings.Contains(text, want) {
			t.Errorf("answer lacks %q:\n%s", want, text)
		}
	}
	resp, stream := post(t, url, "s", body+`,"stream":true}`)
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	var joined strings.Builder
	events := 0
	sc := bufio.NewScanner(strings.NewReader(stream))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct{ Content string }
			}
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil || len(c.Choices) != 1 {
			t.Fatalf("event %q: %v", data, err)
		}
		joined.WriteString(c.Choices[0].Delta.Content)
		events++
	}
	if joined.String() != text || events < 2 || events > 8 || !strings.HasSuffix(stream, "data: [DONE]\n\n") {
		t.Errorf("stream of %d events joins to %q, want the answer %q and [DONE]", events, joined.String(), text)
	}
}

// TestCannedAnswerByDefault: without Describe the answers are the
// benchmarks' canned ones, byte for byte.
func TestCannedAnswerByDefault(t *testing.T) {
	url := serve(t, Options{StreamEvents: 2})
	if _, got := post(t, url, "s", `{"messages":[{"role":"user","content":"x"}]}`); got != mockChat {
		t.Errorf("answer %s", got)
	}
	_, got := post(t, url, "s", `{"messages":[{"role":"user","content":"x"}],"stream":true}`)
	want := "data: {\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"mock\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok0 \"}}]}\n\n" +
		"data: {\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"mock\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok1 \"}}]}\n\n" +
		"data: [DONE]\n\n"
	if got != want {
		t.Errorf("stream\n%s\nwant\n%s", got, want)
	}
}

func TestDemoBackground(t *testing.T) {
	for _, c := range []struct{ prompt, want string }{
		{"You maintain the long-term memory…\n\nKnown facts:\n(none)\n\nNew messages:\nuser: My name is Ada.\nassistant: Hello!\nuser:   I write Go  \nuser: do I?\n\nReply with memory operations only…",
			"[ADD] My name is Ada.\n[ADD] I write Go"},
		{"Previous summary:\nold\n\nNew messages:\nuser: I moved to Lyon\nassistant: nice\n", "The user said: I moved to Lyon"},
		{"New messages:\nassistant: only me\n", "[SKIP]"},
		{"Known facts:\n(none)\n\nNew messages:\nuser: what now?\n", "[SKIP]"},
		{"Review this fact: …", "[SKIP]"},
	} {
		if got := DemoBackground(c.prompt); got != c.want {
			t.Errorf("DemoBackground(%q) = %q, want %q", c.prompt, got, c.want)
		}
	}
}

func TestSplitWords(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		want int
	}{{"a b c d e", 2, 2}, {"a b", 8, 2}, {"", 3, 1}, {"a b c d e f g h i", 4, 3}} {
		got := splitWords(c.s, c.n)
		if len(got) != c.want || strings.Join(got, "") != c.s {
			t.Errorf("splitWords(%q, %d) = %q", c.s, c.n, got)
		}
	}
}
