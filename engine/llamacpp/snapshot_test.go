package llamacpp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/internal/durable"
)

// A session's states exported from one connector and imported into
// another, in front of its own server running the same model, make the
// session's next turn there reuse the whole earlier prompt.
func TestSnapshotStatesMoveBetweenServers(t *testing.T) {
	a := newHarness(t, 2, nil)
	a.do("S", 1)
	// The last turn's KV is not saved yet: the export saves it first.
	a.send(&engine.Request{Tenant: "t1", SessionID: "S", Model: "m", Body: chatBody("S", 2)})
	section, info, err := a.c.ExportStates(context.Background(), "t1", "S", 0)
	if err != nil {
		t.Fatal(err)
	}
	if info.States != 1 || info.Tokens != promptLen("S", 2) || info.Bytes == 0 || info.Fingerprint == "" || info.Layout == "" {
		t.Fatalf("export %+v", info)
	}
	b := newHarness(t, 2, nil)
	got, err := b.c.ImportStates(context.Background(), "t1", "S", section)
	if err != nil {
		t.Fatal(err)
	}
	if got != info {
		t.Fatalf("imported %+v, exported %+v", got, info)
	}
	tm, _ := b.do("S", 3)
	if tm.CacheN != int64(promptLen("S", 2)) || tm.PromptN != int64(promptLen("S", 3)-promptLen("S", 2)) {
		t.Fatalf("the next turn on B: %+v (prompt of turn 2: %d tokens)", tm, promptLen("S", 2))
	}
	if s := b.c.Stats(); s.Restores != 1 {
		t.Fatalf("B's stats %+v", s)
	}
	// The imported state is the session's own: it goes with the session.
	if err := b.c.Forget(context.Background(), "t1", "S"); err != nil {
		t.Fatal(err)
	}
	if n, _ := b.c.cat.size(); n != 0 {
		t.Fatalf("%d states after Forget", n)
	}
	// Imported again under another session id, it serves that id.
	if got, err := b.c.ImportStates(context.Background(), "t1", "S2", section); err != nil || got.States != 1 {
		t.Fatalf("import as S2: %+v %v", got, err)
	}
	if l := b.c.cat.session(sessKey("t1", "S2")); len(l) != 1 {
		t.Fatalf("S2's states %v", l)
	}

	// Under another API key the states could never match: skipped.
	c := newHarness(t, 2, nil)
	if got, err := c.c.ImportStates(context.Background(), "t2", "S", section); err != nil || got.States != 0 || got.Skipped != 1 {
		t.Fatalf("import under another tenant: %+v %v", got, err)
	}
	if n, _ := c.c.cat.size(); n != 0 {
		t.Fatalf("%d states kept from another tenant", n)
	}
	// A size bound keeps the newest states that fit.
	if _, info, err := a.c.ExportStates(context.Background(), "t1", "S", 10); err != nil || info.States != 0 || info.Skipped != 1 {
		t.Fatalf("bounded export %+v %v", info, err)
	}
	// A session without states: a section of none, importable anywhere.
	empty, info, err := a.c.ExportStates(context.Background(), "t1", "nobody", 0)
	if err != nil || info.States != 0 {
		t.Fatal(info, err)
	}
	if _, err := c.c.ImportStates(context.Background(), "t1", "nobody", empty); err != nil {
		t.Fatal(err)
	}
}

// States of another model (fingerprint) or another KV layout are refused
// whole; nothing is imported.
func TestSnapshotStatesOfAnotherModelRefused(t *testing.T) {
	a := newHarness(t, 1, nil)
	a.do("S", 1)
	a.do("S", 2)
	section, _, err := a.c.ExportStates(context.Background(), "t1", "S", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, model := range []int{3, 2} { // same layout, other weights; another layout
		b := newHarness(t, 1, nil)
		b.fake.restart(model, 1)
		if model == 2 {
			b.do("X", 1) // the connector learns its server's layout from a save
		}
		_, err := b.c.ImportStates(context.Background(), "t1", "S", section)
		if !errors.Is(err, engine.ErrOtherModel) {
			t.Fatalf("model %d: %v", model, err)
		}
		if l := b.c.cat.session(sessKey("t1", "S")); len(l) != 0 {
			t.Fatalf("model %d: %d states imported", model, len(l))
		}
	}
	// A server that cannot be reached cannot vouch for its model.
	b := newHarness(t, 1, nil)
	b.srv.Close()
	if _, err := b.c.ImportStates(context.Background(), "t1", "S", section); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("unreachable server: %v", err)
	}
}

// A damaged engine section is refused whole: any flipped byte, any cut.
func TestSnapshotStatesDamageRefused(t *testing.T) {
	a := newHarness(t, 1, nil)
	a.do("S", 1)
	a.do("T", 1)
	a.do("S", 2)
	section, info, err := a.c.ExportStates(context.Background(), "t1", "S", 0)
	if err != nil || info.States != 1 {
		t.Fatal(info, err)
	}
	b := newHarness(t, 1, nil)
	for i := range section {
		x := bytes.Clone(section)
		x[i] ^= 0x08
		if _, err := b.c.ImportStates(context.Background(), "t1", "S", x); !errors.Is(err, durable.ErrCorrupt) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
	}
	for n := range section {
		if _, err := b.c.CheckStates(context.Background(), "t1", section[:n]); !errors.Is(err, durable.ErrCorrupt) {
			t.Fatalf("cut at %d: %v", n, err)
		}
	}
	if _, err := b.c.CheckStates(context.Background(), "t1", append(bytes.Clone(section), 0)); !errors.Is(err, durable.ErrCorrupt) {
		t.Fatalf("extended: %v", err)
	}
	if n, _ := b.c.cat.size(); n != 0 {
		t.Fatalf("%d states kept from damaged sections", n)
	}
}

func FuzzSnapshotStates(f *testing.F) {
	h := newHarness(f, 1, nil)
	for i := range 2 {
		h.do(fmt.Sprint("S", i), 1)
	}
	for _, s := range []string{"S0", "S1", "none"} {
		section, _, err := h.c.ExportStates(context.Background(), "t1", s, 0)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(section)
	}
	f.Add([]byte{1, 200, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		states, err := parseStates(b, h.c.opts.MaxStateBytes)
		if err != nil {
			if !errors.Is(err, durable.ErrCorrupt) {
				t.Fatalf("error %v does not match durable.ErrCorrupt", err)
			}
			return
		}
		for _, st := range states {
			if st.meta == nil || int64(len(st.raw)) != st.meta.size {
				t.Fatalf("state %+v", st)
			}
		}
	})
}
