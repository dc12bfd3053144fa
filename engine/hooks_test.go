package engine

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/internal/obs"
)

// bare is a connector with a name and nothing else.
type bare struct{}

func (bare) Name() string { return "bare" }

// beforeOnly rewrites bodies and counts its responses in Report.
type beforeOnly struct{ afters int }

func (*beforeOnly) Name() string { return "before" }
func (*beforeOnly) Before(_ context.Context, req *Request) ([]byte, error) {
	return append([]byte("x"), req.Body...), nil
}
func (b *beforeOnly) After(context.Context, *Request, *Response) { b.afters++ }
func (b *beforeOnly) Report() Report {
	return Stats{Connector: "before", Enabled: true, Responses: int64(b.afters), Timings: Timings{CacheN: 7}}
}

// TestHooksDefaults: a hook the connector lacks does what a connector that
// keeps nothing would, and one it has is called.
func TestHooksDefaults(t *testing.T) {
	ctx := context.Background()
	if Wrap(nil) != nil {
		t.Fatal("hooks of no connector")
	}
	h := Wrap(bare{})
	if Wrap(h) != h {
		t.Fatal("Wrap of hooks wraps again")
	}
	req := &Request{Body: []byte(`{}`)}
	if b, err := h.Before(ctx, req); err != nil || string(b) != `{}` {
		t.Fatalf("default Before: %s %v", b, err)
	}
	h.After(ctx, req, &Response{})
	h.Settle(ctx, req)
	if _, ok := h.SessionStats("t", "s"); ok || h.Forget(ctx, "t", "s") != nil || h.Close() != nil {
		t.Fatal("default session hooks")
	}
	if st := h.Stats(); st != (Stats{Connector: "bare", Enabled: true}) {
		t.Fatalf("default stats %+v", st)
	}
	if f := h.ConsoleFacts(); f.Status != "on" || f.Summary != "0 requests" || len(f.Lines) != 1 || f.Lines[0].Name != "Prompt tokens" {
		t.Fatalf("default facts %+v", f)
	}

	b := &beforeOnly{}
	h = Wrap(b)
	if out, _ := h.Before(ctx, req); string(out) != `x{}` {
		t.Fatalf("Before not called: %s", out)
	}
	h.After(ctx, req, &Response{})
	if b.afters != 1 || h.Stats().Responses != 1 {
		t.Fatalf("After not called: %d", b.afters)
	}

	// Every connector writes the families of Stats.
	reg := obs.New()
	h.ExportMetrics(reg)
	var buf bytes.Buffer
	reg.WritePrometheus(&buf)
	for _, want := range []string{`sidecar_engine_enabled{connector="before"} 1`, "sidecar_engine_cached_prompt_tokens_total 7", "sidecar_engine_reused_tokens_total 0"} {
		if !strings.Contains(buf.String(), want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, buf.String())
		}
	}
}

// inline says its hooks never block; blocking has hooks and says nothing.
type inline struct{ beforeOnly }

func (*inline) NeverBlocks() bool { return true }

type blocking struct{ beforeOnly }

// TestHooksNeverBlocks: the capability is the connector's word (or the
// absence of both request hooks), never its name.
func TestHooksNeverBlocks(t *testing.T) {
	for _, c := range []struct {
		name string
		h    *Hooks
		want bool
	}{
		{"no connector", Wrap(nil), true},
		{"no request hooks", Wrap(bare{}), true},
		{"hooks, no word", Wrap(&blocking{}), false},
		{"hooks and the word", Wrap(&inline{}), true},
	} {
		if got := c.h.NeverBlocks(); got != c.want {
			t.Errorf("%s: NeverBlocks = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -12345: "-12,345"} {
		if got := FormatCount(n); got != want {
			t.Errorf("FormatCount(%d) = %q, want %q", n, got, want)
		}
	}
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536 << 10: "1.5 MiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
	if got := FormatSeconds(1.005); got != "1.00" && got != "1.01" {
		t.Errorf("FormatSeconds = %q", got)
	}
}
