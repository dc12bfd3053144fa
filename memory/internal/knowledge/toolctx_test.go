package knowledge

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
)

func TestParseToolContext(t *testing.T) {
	f := func(in, want string, wantErr bool) {
		t.Helper()
		got, err := ParseToolContext(in, 80)
		if got != want || (err != nil) != wantErr || (err != nil && !errors.Is(err, memerr.ErrInvalid)) {
			t.Fatalf("ParseToolContext(%q) = %q, %v; want %q, error %v", in, got, err, want, wantErr)
		}
	}
	f("get_weather said Paris is sunny, 21°C.", "get_weather said Paris is sunny, 21°C.", false)
	f("  Two\n lines\tfolded.\x00 ", "Two lines folded.", false)
	f("[SKIP]", "", false)
	f(" \n ", "", true)
	f(strings.Repeat("word ", 17), "", true) // 84 bytes > 80
	f(strings.Repeat("x", 400), "", true)
	f("The tool said [DELETE:fact-1].", "", true)
	f("ok [keep] this", "", true)
}
