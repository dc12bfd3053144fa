package jsonscan

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

var corpus = []string{
	``, ` `, `{}`, `[]`, `{ }`, `[ ]`, `null`, `true`, `false`, `nul`, `truex`, `0`, `-0`, `01`, `-`, `1.`, `1.5`, `.5`,
	`1e5`, `1E+5`, `1e-5`, `1e`, `1e+`, `-1.5e10`, `"a"`, `"`, `"\"`, `"\\"`, `"\u00e9"`, `"\u00g9"`, `"\u00e"`,
	`"\x"`, `"\/"`, "\"\t\"", "\"a\nb\"", "\"\x7f\"", "\"\xff\xfe\"", `"日本語"`, `{"a":1}`, `{"a":1,}`, `{"a" 1}`,
	`{"a":}`, `{a:1}`, `{"a":1 "b":2}`, `{"a":[1,2,{"b":null}],"c":"d"}`, `[1,[2,[3,[4]]]]`, `[1,]`, `[,1]`,
	`[1 2]`, `{"a":1}}`, `[[]`, `[]]`, ` {"a" : [ true , false , null ] } `, "\t\n\r[1]\r\n", `[1]x`, `{"":""}`,
	`{"model":"m","messages":[{"role":"user","content":"Say something short."}],"stream":true}`,
}

// members walks b with Members: its members as key=value, and Valid.
func members(b []byte) ([]string, bool) {
	var got []string
	m := Members(b)
	for m.Next() {
		got = append(got, string(m.Key())+"="+string(m.Value()))
	}
	return got, m.Valid()
}

// FuzzValid: Valid agrees with encoding/json.Valid on every input, and
// Members with it on objects (go test -fuzz FuzzValid ./internal/jsonscan).
func FuzzValid(f *testing.F) {
	for _, s := range corpus {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want := json.Valid(b)
		if got := Valid(b); got != want {
			t.Fatalf("Valid(%q) = %v, encoding/json says %v", b, got, want)
		}
		m := Members(b)
		for m.Next() {
			if k, v := m.Key(), m.Value(); !json.Valid(k) || !json.Valid(v) {
				t.Fatalf("Members(%q) gave key %q value %q", b, k, v)
			}
		}
		isObject := want && bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), []byte("{"))
		if m.Valid() != isObject {
			t.Fatalf("Members(%q).Valid() = %v, an object: %v", b, m.Valid(), isObject)
		}
	})
}

func TestValidAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range corpus {
		if got, want := Valid([]byte(s)), json.Valid([]byte(s)); got != want {
			t.Errorf("Valid(%q) = %v, want %v", s, got, want)
		}
	}
}

// TestStringBytesAtEveryOffset: a quote, a backslash or a control byte is
// found wherever it falls in an eight-byte word.
func TestStringBytesAtEveryOffset(t *testing.T) {
	for n := range 40 {
		for _, c := range []string{`"`, `\`, "\x00", "\x1f", "\n", `\n`, `\u0041`, "\x20", "\x7f", "\x80", "\xff", "é", `!`, `#`, `[`, `]`} {
			s := `"` + strings.Repeat("x", n) + c + strings.Repeat("y", 17) + `"`
			if got, want := Valid([]byte(s)), json.Valid([]byte(s)); got != want {
				t.Fatalf("Valid(%q) = %v, want %v", s, got, want)
			}
		}
	}
}

// TestDeepNesting: MaxDepth levels pass, one more does not, and a body of
// eight million brackets is refused without running out of stack.
func TestDeepNesting(t *testing.T) {
	for _, d := range []int{MaxDepth - 1, MaxDepth, MaxDepth + 1} {
		for _, open := range []string{"[", `{"a":`} {
			close := "]"
			if open != "[" {
				close = "}"
			}
			s := strings.Repeat(open, d) + "1" + strings.Repeat(close, d)
			if got, want := Valid([]byte(s)), json.Valid([]byte(s)); got != want || got != (d <= MaxDepth) {
				t.Errorf("%d levels of %s: %v, encoding/json %v", d, open, got, want)
			}
		}
	}
	deep := append([]byte(`{"model":"m","messages":`), bytes.Repeat([]byte("["), 8<<20)...)
	if _, ok := members(deep); Valid(deep) || ok {
		t.Fatal("eight million open brackets are valid")
	}
}

func TestMembers(t *testing.T) {
	got, ok := members([]byte(` { "a" : 1 , "b\"c":{"x":[1,2]}, "a":"two" } `))
	want := []string{`"a"=1`, `"b\"c"={"x":[1,2]}`, `"a"="two"`}
	if !ok || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Members: %v %q, want %q", ok, got, want)
	}
	for _, s := range []string{`[1]`, `{"a":1} x`, `{"a":1,}`, `"a"`, ``, `{"a":1,"b":}`} {
		if _, ok := members([]byte(s)); ok {
			t.Errorf("Members(%q) is an object", s)
		}
	}
	// The members before the first invalid byte are seen.
	if got, ok := members([]byte(`{"a":1,"b":2,x}`)); ok || fmt.Sprint(got) != fmt.Sprint([]string{`"a"=1`, `"b"=2`}) {
		t.Errorf("Members of a broken object: %q %v", got, ok)
	}
	if got, ok := members([]byte(`{}`)); !ok || len(got) != 0 {
		t.Fatalf("{}: %q %v", got, ok)
	}
	// Valid only once the walk ended; Next stays false after it.
	m := Members([]byte(`{"a":1}`))
	if m.Valid() || !m.Next() || m.Valid() || m.Next() || !m.Valid() || m.Next() || m.Key() != nil {
		t.Fatal("Members' walk does not end once, valid")
	}
	var zero Scanner
	if zero.Next() || zero.Valid() {
		t.Fatal("the zero Scanner holds an object")
	}
}

// chatBody is a 27 KB chat request: forty turns of history.
func chatBody() []byte {
	var b strings.Builder
	b.WriteString(`{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("You are a helpful assistant. ", 20) + `"}`)
	for i := range 40 {
		fmt.Fprintf(&b, `,{"role":"user","content":"%s"},{"role":"assistant","content":"%s"}`,
			strings.Repeat(fmt.Sprintf("Tell me about item %d in detail please. ", i), 8),
			strings.Repeat(fmt.Sprintf("Item %d is a thing with properties.\\n ", i), 8))
	}
	b.WriteString(`],"stream":false}`)
	return []byte(b.String())
}

func BenchmarkValid(b *testing.B) {
	body := chatBody()
	if !Valid(body) || !json.Valid(body) {
		b.Fatal("the body is not valid")
	}
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		Valid(body)
	}
}

// TestName: a member's key as encoding/json reads it, escapes decoded.
func TestName(t *testing.T) {
	for raw, want := range map[string]string{
		`"model"`:        "model",
		`""`:             "",
		`"u\u0073er"`:    "user",
		`"a\"b\\c\/d\n"`: "a\"b\\c/d\n",
		`"\ud83d\ude00"`: "\U0001F600",
		`"tim\u0069ngs"`: "timings",
	} {
		if got := Name([]byte(raw)); got != want {
			t.Errorf("Name(%s) = %q, want %q", raw, got, want)
		}
	}
}
