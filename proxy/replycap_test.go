package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/memory"
)

// TestHugeRepliesAreRecordedCapped reproduces issue 12 row 3's shape: an
// upstream reply of one huge "word" (here 4 MiB; 200 MB drove RSS to 6.8 GB
// on main) is recorded cut to Storage.MaxReplyBytes and marked partial,
// streamed or not, while the client still gets all of it.
func TestHugeRepliesAreRecordedCapped(t *testing.T) {
	const size, maxReply = 4 << 20, 64 << 10
	word := strings.Repeat("a", size)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := 0; i < size; i += 64 << 10 {
				fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", word[i:i+64<<10])
			}
			fmt.Fprint(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}]}`, word)
	}))
	defer up.Close()
	st := openMemory(t, memory.Options{Window: memory.WindowOptions{Limit: 32768}, Storage: memory.StorageOptions{MaxReplyBytes: maxReply}})
	base, srv := startSidecar(t, up.URL, func(o *Options) { o.Memory = st })
	for _, stream := range []bool{false, true} {
		id := fmt.Sprintf("huge-%v", stream)
		resp, body := post(t, base+"/v1/chat/completions",
			fmt.Sprintf(`{"stream":%v,"messages":[{"role":"user","content":"say a lot"}]}`, stream),
			map[string]string{"X-Session-ID": id, "Authorization": "Bearer k"})
		if resp.StatusCode != 200 || len(body) < size {
			t.Fatalf("stream=%v: status %d, %d bytes to the client", stream, resp.StatusCode, len(body))
		}
		var v sessionView
		waitFor(t, srv, func() bool {
			return getJSON(t, base+"/v1/sessions/"+id, "k", &v) == 200 && len(v.Messages) == 2
		})
		if m := v.Messages[1]; m.Role != "assistant" || len(m.Content) > maxReply || len(m.Content) < maxReply/2 ||
			!strings.HasPrefix(word, m.Content) || !m.Partial {
			t.Fatalf("stream=%v: recorded %d bytes, partial %v", stream, len(m.Content), m.Partial)
		}
	}
}

func TestReplyMessageCapsWithoutParsingAll(t *testing.T) {
	f := func(content string, max int, want string, wantCut bool) {
		t.Helper()
		body := fmt.Sprintf(`{"choices":[{"index":0,"message":{"role":"assistant","content":%s}}]}`, content)
		raw, cut := replyMessage([]byte(body), max)
		msgs, err := memory.ParseMessages(append(append([]byte("["), raw...), ']'))
		if err != nil || len(msgs) != 1 || msgs[0].Content != want || cut != wantCut {
			t.Errorf("content %.40s… max %d: got %q cut %v (%v), want %q cut %v", content, max, raw, cut, err, want, wantCut)
		}
	}
	f(`"short"`, 100, "short", false)
	long := strings.Repeat("ab", 5000)
	f(`"`+long+`"`, 100, long[:100], true)
	// Escapes before and across the cut.
	esc := strings.Repeat(`x\n\"\u00e9`, 3000)
	f(`"`+esc+`"`, 64, memory.CutText(strings.Repeat("x\n\"é", 30), 64), true)
	f(`null`, 10, "", false)
}
