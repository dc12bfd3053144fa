package httpapi

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestErrorJSONIsTheOpenAIEnvelope(t *testing.T) {
	var got map[string]map[string]any
	if err := json.Unmarshal(ErrorJSON(TypeNotFound, "no_session", `a "quoted" <msg>`), &got); err != nil {
		t.Fatal(err)
	}
	e := got["error"]
	if e["type"] != TypeNotFound || e["code"] != "no_session" || e["message"] != `a "quoted" <msg>` || e["param"] != nil {
		t.Fatalf("envelope %v", got)
	}
	if _, ok := e["param"]; !ok {
		t.Fatal("param must be present (null), as OpenAI sends it")
	}
}

func TestValidID(t *testing.T) {
	for id, ok := range map[string]bool{
		"s-1": true, "日本": true, strings.Repeat("a", MaxIDLen): true,
		strings.Repeat("a", MaxIDLen+1): false, "a\x00b": false, "a\x7f": false, "\xff": false,
	} {
		if err := ValidID(id); (err == nil) != ok {
			t.Errorf("ValidID(%q) = %v, want ok=%v", id, err, ok)
		}
	}
}

func TestPathSegments(t *testing.T) {
	segs, err := PathSegments([]byte("/a/b%2Fc/"))
	if err != nil || strings.Join(segs, "|") != "a|b/c|" {
		t.Fatalf("%q %v", segs, err)
	}
	if _, err := PathSegments([]byte("/%zz")); err == nil {
		t.Fatal("a bad escape must be refused")
	}
	if segs, _ := PathSegments(nil); segs != nil || !IsDotName("..") || IsDotName("...") {
		t.Fatal("empty tail or dot names")
	}
}
