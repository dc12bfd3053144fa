package llamacpp

import (
	"encoding/json"
	"testing"
)

func TestSetSlotFields(t *testing.T) {
	f := func(in string, slot int, want string) {
		t.Helper()
		got, err := setSlotFields([]byte(in), slot, 0)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if string(got) != want {
			t.Fatalf("%s:\n got %s\nwant %s", in, got, want)
		}
		if !json.Valid(got) {
			t.Fatalf("invalid JSON %s", got)
		}
	}
	f(`{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.10}`, 3,
		`{"id_slot":3,"cache_prompt":true,"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.10}`)
	f(`  {}`, 0, `{"id_slot":0,"cache_prompt":true}`)
	f("{ \"a\" : 1 }\n", 1, "{\"id_slot\":1,\"cache_prompt\":true,\"a\" : 1 }\n")
	// Client values are replaced, other members keep order and bytes.
	f(`{"model":"m","id_slot":7,"x":1e-7,"cache_prompt":false,"z":{"id_slot":1}}`, 2,
		`{"id_slot":2,"cache_prompt":true,"model":"m","x":1e-7,"z":{"id_slot":1}}`)
	// n_cache_reuse is added, after the slot fields, unless the client set
	// its own.
	g := func(in string, reuse int, want string) {
		t.Helper()
		got, err := setSlotFields([]byte(in), 1, reuse)
		if err != nil || string(got) != want || !json.Valid(got) {
			t.Fatalf("%s reuse %d:\n got %s, %v\nwant %s", in, reuse, got, err, want)
		}
	}
	g(`{"model":"m"}`, 64, `{"id_slot":1,"cache_prompt":true,"n_cache_reuse":64,"model":"m"}`)
	g(`{}`, 64, `{"id_slot":1,"cache_prompt":true,"n_cache_reuse":64}`)
	g(`{"n_cache_reuse":0,"model":"m"}`, 64, `{"id_slot":1,"cache_prompt":true,"n_cache_reuse":0,"model":"m"}`)
	g(`{"id_slot":3,"n_cache_reuse":512}`, 64, `{"id_slot":1,"cache_prompt":true,"n_cache_reuse":512}`)
	for _, bad := range []string{``, `[]`, `"x"`, `{"a":`, `{"a":1} {"b":2}`, `nul`} {
		out, err := setSlotFields([]byte(bad), 1, 64)
		if err == nil || string(out) != bad {
			t.Errorf("%q: %q, %v", bad, out, err)
		}
	}
}
