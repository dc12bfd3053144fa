package memory

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestEncodingForModel(t *testing.T) {
	f := func(model string, want Encoding) {
		t.Helper()
		if got := EncodingForModel(model); got != want {
			t.Errorf("EncodingForModel(%q) = %v, want %v", model, got, want)
		}
	}
	f("gpt-4o", O200K)
	f("gpt-4o-mini-2024-07-18", O200K)
	f("openai/gpt-4.1", O200K)
	f("gpt-5", O200K)
	f("GPT-5-mini", O200K)
	f("o1", O200K)
	f("o3-mini", O200K)
	f("o4-mini", O200K)
	f("gpt-oss-20b", O200K)
	f("gpt-4", CL100K)
	f("gpt-3.5-turbo", CL100K)
	f("meta-llama/Llama-3.1-8B-Instruct", CL100K)
	f("qwen2.5", CL100K)
	f("o1ympus", CL100K)
	f("", CL100K)
}

func TestStoreEncodingOverrides(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) {
		o.Window.ModelEncodings = map[string]string{"llama-*": "o200k_base", "gpt-4o-legacy": "cl100k_base"}
		o.Window.ModelLimits = map[string]int{"big*": 32768, "big-small": 4096}
	})
	f := func(model string, want Encoding, limit int) {
		t.Helper()
		if got := s.Encoding(model); got != want {
			t.Errorf("Encoding(%q) = %v, want %v", model, got, want)
		}
		if got := s.Limit(model); got != limit {
			t.Errorf("Limit(%q) = %d, want %d", model, got, limit)
		}
	}
	f("llama-3", O200K, 8192)
	f("gpt-4o-legacy", CL100K, 8192)
	f("gpt-4o", O200K, 8192)
	f("big-model", CL100K, 32768)
	f("big-small", CL100K, 4096)
}

func TestTokenCounts(t *testing.T) {
	tk := NewTokenizer(0)
	f := func(e Encoding, s string, want int) {
		t.Helper()
		if got := tk.Count(e, s); got != want {
			t.Errorf("Count(%v, %q) = %d, want %d", e, s, got, want)
		}
	}
	// Reference values from OpenAI's tiktoken.
	f(CL100K, "tiktoken is great!", 6)
	f(CL100K, "hello world", 2)
	f(O200K, "hello world", 2)
	f(CL100K, "", 0)
	// Special-token text is counted as text, never rejected or panicking.
	f(CL100K, "<|endoftext|> hi", 8)
	// o200k is much denser on Devanagari: the encodings really differ.
	hindi := "नमस्ते दुनिया, आप कैसे हैं? मैं ठीक हूँ।"
	f(CL100K, hindi, 42)
	f(O200K, hindi, 14)
}

func TestMessageTokensIsContentPlusFraming(t *testing.T) {
	tk := NewTokenizer(0)
	m := text("user", "tiktoken is great!")
	if got := tk.MessageTokens(CL100K, &m); got != 6+MessageFraming {
		t.Fatalf("MessageTokens = %d, want %d", got, 6+MessageFraming)
	}
	var parts Message
	json.Unmarshal([]byte(`{"role":"user","content":[{"type":"text","text":"tiktoken is "},{"type":"text","text":"great!"},{"type":"image_url","image_url":{"url":"x"}}]}`), &parts)
	if got := tk.MessageTokens(CL100K, &parts); got != 6+MessageFraming+NonTextPartTokens {
		t.Fatalf("array content: %d, want %d", got, 6+MessageFraming+NonTextPartTokens)
	}
}

func TestTokenCacheIsUsedAndBounded(t *testing.T) {
	tk := NewTokenizer(64)
	a := strings.Repeat("alpha ", 50)
	n := tk.Count(CL100K, a)
	if tk.cache.len() != 1 {
		t.Fatalf("cache len %d after one count", tk.cache.len())
	}
	if got := tk.Count(CL100K, a); got != n || tk.cache.len() != 1 {
		t.Fatalf("second count %d (len %d), want %d from cache", got, tk.cache.len(), n)
	}
	// The same text under another encoding is another entry.
	tk.Count(O200K, a)
	if tk.cache.len() != 2 {
		t.Fatalf("cache len %d, want 2", tk.cache.len())
	}
	for i := 0; i < 10000; i++ {
		tk.Count(CL100K, strings.Repeat("b", i%300)+string(rune('a'+i%26))+strings.Repeat("c", i/300))
	}
	if l := tk.cache.len(); l > 64 {
		t.Fatalf("cache holds %d entries, bound 64", l)
	}
}

func TestMessageRoundTripIsByteExact(t *testing.T) {
	raws := []string{
		`{"role":"user","content":"hi"}`,
		`{ "content" : [ {"type":"text","text":"a"} , {"type":"image_url","image_url":{"url":"data:x"}} ], "role":"user", "x-extra": 1 }`,
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]}`,
		`{"role":"tool","tool_call_id":"c1","content":"result"}`,
	}
	for _, raw := range raws {
		var m Message
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		// MarshalJSON and AppendMessagesJSON emit the bytes unchanged
		// (json.Marshal would compact them).
		out, err := m.MarshalJSON()
		if err != nil || string(out) != raw {
			t.Fatalf("re-emitted %s, want %s (%v)", out, raw, err)
		}
		if got := string(AppendMessagesJSON(nil, []json.RawMessage{m.Raw, m.Raw})); got != "["+raw+","+raw+"]" {
			t.Fatalf("AppendMessagesJSON = %s", got)
		}
	}
	msgs, err := ParseMessages([]byte(`[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"x"},{"type":"text","text":"y"}]}]`))
	if err != nil || len(msgs) != 2 || msgs[1].Content != "xy" || msgs[0].Role != "system" {
		t.Fatalf("ParseMessages: %+v %v", msgs, err)
	}
	for _, bad := range []string{`{}`, `[1]`, `[{"role":"user","content":5}]`, `{"role":"user"}`, `[{"content":"x"}]`} {
		if _, err := ParseMessages([]byte(bad)); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseMessages(%s) = %v, want ErrInvalid", bad, err)
		}
	}
}

func FuzzMessage(f *testing.F) {
	f.Add([]byte(`{"role":"user","content":"hi"}`))
	f.Add([]byte(`{"role":"user","content":[{"type":"text","text":"a"},"b",{"type":"input_audio"}]}`))
	f.Add([]byte(`{"role":"assistant","tool_calls":[{"id":"1","function":{"name":"n","arguments":{"x":1}}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var m Message
		if err := json.Unmarshal(data, &m); err != nil {
			return
		}
		out, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		var m2 Message
		if err := json.Unmarshal(out, &m2); err != nil {
			t.Fatalf("re-parse of %s: %v", out, err)
		}
		if m2.matchKey() != m.matchKey() || m2.Content != m.Content || m2.Role != m.Role {
			t.Fatalf("round trip changed the message: %+v vs %+v", m, m2)
		}
		if n := recount.MessageTokens(CL100K, &m); n < MessageFraming {
			t.Fatalf("cost %d below framing", n)
		}
	})
}
