package connectors

import (
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/engine"
)

// TestRegistry: every connector opens by its name as a plugin of that
// name, none opens nothing, an unknown name says what is known, and a
// connector's own errors name it.
func TestRegistry(t *testing.T) {
	p, err := All.Open("generic", engine.Config{BaseURL: "http://127.0.0.1:1"})
	if err != nil || p == nil || p.Name() != "generic" {
		t.Fatalf("generic: %v %v", p, err)
	}
	for _, name := range []string{"none", ""} {
		if p, err := All.Open(name, engine.Config{}); p != nil || err != nil {
			t.Fatalf("%q: %v %v", name, p, err)
		}
	}
	if _, err := All.Open("vllm", engine.Config{}); err == nil || err.Error() != `--engine "vllm": want generic, llamacpp or none` {
		t.Fatalf("unknown: %v", err)
	}
	if _, err := All.Open("llamacpp", engine.Config{BaseURL: "http://127.0.0.1:1"}); err == nil || !strings.HasPrefix(err.Error(), "engine llamacpp: ") {
		t.Fatalf("llamacpp without a slot dir: %v", err)
	}
	if u := All.Usage(); u != "generic (byte-stable prefixes, stats only), llamacpp (slot save/restore) or none" {
		t.Fatalf("usage %q", u)
	}
	for _, r := range All {
		if r.Name == engine.None || r.Help == "" || r.Open == nil {
			t.Fatalf("registration %+v", r)
		}
	}
}
