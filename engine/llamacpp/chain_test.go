package llamacpp

import (
	"fmt"
	"strings"
	"testing"
)

func TestRequestChain(t *testing.T) {
	body := func(msgs ...string) []byte {
		var parts []string
		for i, m := range msgs {
			role := "user"
			if i == 0 {
				role = "system"
			}
			parts = append(parts, fmt.Sprintf(`{"role":%q,"content":%q}`, role, m))
		}
		return []byte(`{"model":"m","messages":[` + strings.Join(parts, ",") + `]}`)
	}
	a := requestChain(1, body("doc", "q1", "q2"))
	b := requestChain(1, body("doc", "q1", "other"))
	if a.len() != 3 || b.len() != 3 || a.hashes[1] != b.hashes[1] || a.hashes[2] == b.hashes[2] {
		t.Fatalf("a %v b %v", a.hashes, b.hashes)
	}
	if !a.extends(requestChain(1, body("doc", "q1"))) || a.extends(b) {
		t.Fatal("extends")
	}
	if a.bytes[0] != 9 || a.bytes[2] != a.bytes[1]+int64(len("user")+len("q2")) { // role + content (+ tools, kwargs)
		t.Fatalf("bytes %v", a.bytes)
	}
	// The seed (fingerprint, tenant), the tools and the template arguments
	// change every hash; whitespace and key order of the JSON do not.
	for name, other := range map[string]chain{
		"seed":   requestChain(2, body("doc", "q1", "q2")),
		"tools":  requestChain(1, []byte(`{"tools":[{"type":"function"}],"messages":[{"role":"system","content":"doc"}]}`)),
		"kwargs": requestChain(1, []byte(`{"chat_template_kwargs":{"x":1},"messages":[{"role":"system","content":"doc"}]}`)),
	} {
		if other.hashes[0] == a.hashes[0] {
			t.Errorf("%s does not change the chain", name)
		}
	}
	if c := requestChain(1, []byte(` { "messages" : [ {"content":"doc", "role":"system"} ] }`)); c.hashes[0] != a.hashes[0] {
		t.Error("JSON layout changes the chain")
	}
	// Completions: pieces of promptChunk bytes.
	p := requestChain(1, []byte(`{"prompt":"`+strings.Repeat("x", 2*promptChunk+5)+`"}`))
	if p.len() != 3 || p.bytes[2] != 2*promptChunk+5 {
		t.Fatalf("prompt chain %v", p.bytes)
	}
	for _, bad := range []string{``, `{`, `[]`, `{"messages":3}`, `{"model":"m"}`} {
		if c := requestChain(1, []byte(bad)); c.len() != 0 {
			t.Errorf("%q gave %d pieces", bad, c.len())
		}
	}
	// Very long conversations fold their tail into the last piece.
	var many []string
	for i := range maxChainLen + 10 {
		many = append(many, fmt.Sprint("m", i))
	}
	long := requestChain(1, body(many...))
	if long.len() != maxChainLen || long.bytes[maxChainLen-1] <= long.bytes[maxChainLen-2] {
		t.Fatalf("long chain of %d pieces", long.len())
	}
}

func TestCatalog(t *testing.T) {
	c := newCatalog()
	mk := func(id, sess string, hashes ...uint64) *stateMeta {
		m := &stateMeta{id: id, sess: sess, fp: "fp", tokens: 100 * len(hashes), size: 1000}
		for i, h := range hashes {
			m.chain.hashes = append(m.chain.hashes, h)
			m.chain.bytes = append(m.chain.bytes, int64(10*(i+1)))
		}
		return m
	}
	c.add(mk("a1", "A", 1, 2), 4)
	if drop := c.add(mk("a2", "A", 1, 2, 3), 4); len(drop) != 1 || drop[0].id != "a1" {
		t.Fatalf("a2 does not supersede a1: %v", drop)
	}
	c.add(mk("b1", "B", 1, 7), 4) // B shares the first piece
	m, i, ok := c.lookup("fp", chain{hashes: []uint64{1, 2, 3, 4}})
	if !ok || m.id != "a2" || i != 2 || m.tokensAt(i) != 300 {
		t.Fatalf("lookup: %v %d %v", m, i, ok)
	}
	if m, i, ok := c.lookup("fp", chain{hashes: []uint64{1, 9}}); !ok || i != 0 || m.id != "b1" {
		t.Fatalf("shared first piece: %v %d %v (want the newest state holding it)", m, i, ok)
	}
	if _, _, ok := c.lookup("other", chain{hashes: []uint64{1, 2}}); ok {
		t.Fatal("another fingerprint matched")
	}
	// A branch does not supersede; beyond keep, the oldest goes.
	c.add(mk("a3", "A", 1, 5), 2)
	if drop := c.add(mk("a4", "A", 1, 6), 2); len(drop) != 1 || drop[0].id != "a2" {
		t.Fatalf("over keep: %v", drop)
	}
	if n, b := c.size(); n != 3 || b != 3000 {
		t.Fatalf("size %d %d", n, b)
	}
	c.remove("b1")
	if m, _, _ := c.lookup("fp", chain{hashes: []uint64{1, 7}}); m == nil || m.id == "b1" {
		t.Fatalf("removed state still found: %v", m)
	}
	// Metadata round trip, and damage refused.
	orig := mk("x", "S", 1, 2, 3)
	orig.layout = "L"
	enc := appendStateMeta(nil, orig)
	got, err := parseStateMeta(enc)
	if err != nil || got.sess != "S" || got.fp != "fp" || got.layout != "L" || got.tokens != 300 || got.chain.len() != 3 || got.chain.bytes[2] != 30 {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for i := range enc {
		if _, err := parseStateMeta(enc[:i]); err == nil {
			t.Fatalf("truncated to %d bytes accepted", i)
		}
	}
}

func FuzzParseStateMeta(f *testing.F) {
	m := &stateMeta{sess: "s", fp: "f", tokens: 3, chain: chain{hashes: []uint64{1, 2}, bytes: []int64{3, 4}}}
	f.Add(appendStateMeta(nil, m))
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseStateMeta(b)
		if err != nil {
			return
		}
		if m.chain.len() == 0 || m.chain.len() > maxChainLen {
			t.Fatalf("accepted a chain of %d pieces", m.chain.len())
		}
		if got, err := parseStateMeta(appendStateMeta(nil, m)); err != nil || got.chain.len() != m.chain.len() {
			t.Fatalf("re-encoding: %v", err)
		}
	})
}
