package sanitize

import "testing"

func TestText(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"plain", 100, "plain"},
		{"  a\tb\n\nc  ", 100, "a b c"},
		{"zero\u200bwidth\u202ebidi", 100, "zero width bidi"},
		{"bad\xffutf8", 100, "bad utf8"},
		{"héllo wörld", 3, "hé…"},
		{"héllo", 2, "h…"},
	} {
		if got := Text(c.in, c.max); got != c.want {
			t.Errorf("Text(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
		}
	}
}

func TestTruncate(t *testing.T) {
	if got := Truncate("ab", 5); got != "ab" {
		t.Fatalf("short: %q", got)
	}
	if got := Truncate("aé", 2); got != "a…" {
		t.Fatalf("on a rune boundary: %q", got)
	}
}
