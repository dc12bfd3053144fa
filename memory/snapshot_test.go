package memory

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

// snapshotStores runs a conversation with evictions, facts, triples and
// recall on a store A and returns it with a second, empty store B of the
// same options.
func snapshotStores(t *testing.T) (a, b *Store, ex *scriptedExtractor) {
	ex = &scriptedExtractor{}
	mod := func(o *Options) {
		o.Extraction.Extractor = ex
		o.Extraction.Every = 2
		o.Window.Limit = 700
		o.Window.SystemReserve = 100
		o.Window.ToolsReserve = 50
	}
	a = openBubbleStore(t, t.TempDir(), mod)
	b = openBubbleStore(t, t.TempDir(), mod)
	ex.replies = []string{strings.Join([]string{
		"[ADD] The user's dog Rex adores the red ball.",
		"[ADD] The user walks Rex at dawn.",
		"[TRIPLE] Rex | favourite toy | red ball | +1",
		"[TRIPLE] Rex | walked at | dawn | +2",
	}, "\n")}
	turn := func(u, r string) {
		prepare2(t, a, "t", "s", "ann", text("user", u)).Complete(text("assistant", r))
		synctest.Wait()
	}
	turn("My terrier Rex has a favourite thing to chase at dawn", "Nice.")
	for i := range 12 {
		turn(fmt.Sprintf("Tell me about %s, part %d: %s", []string{"harbors", "copper", "orbits"}[i%3], i, strings.Repeat("lorem ipsum dolor ", 12)),
			fmt.Sprintf("reply %d %s", i, strings.Repeat("sit amet ", 8)))
	}
	turn("What is Rex's favourite toy?", "The red ball.")
	return a, b, ex
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func prepare2(t *testing.T, s *Store, tenant, id, user string, msgs ...Message) *Turn {
	t.Helper()
	turn, err := s.Prepare(context.Background(), TurnRequest{Tenant: tenant, SessionID: id, UserID: user, Mode: ModeAppend, Model: "test-model", Messages: msgs})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	return turn
}

// state is what a session holds, as the APIs show it plus its working
// memory, with the session's id, times and the tenant left out.
func sessionState(t *testing.T, s *Store, tenant, id string) (SessionView, MemoryView, []Triple, *wmSnapshot) {
	t.Helper()
	v, err := s.Session(tenant, id)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.Memory(tenant, id)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := s.Triples(tenant, "ann", 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ts {
		ts[i].Session = ""
	}
	sess, err := s.reg.session(tenant, id, false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.reg.unpin(sess)
	sess.mu.Lock()
	wm := sess.wm.snapshot()
	sess.mu.Unlock()
	v.ID, m.ID, v.UpdatedAt, v.Model, v.Encoding = "", "", v.UpdatedAt.UTC(), "", ""
	v.CreatedAt = v.CreatedAt.UTC()
	return v, m, ts, wm
}

// A session exported from one store and imported into another (another
// tenant and id even) holds the same history, units, facts, triples,
// access counts and working memory, and its next turn is the same window
// and recall, byte for byte.
func TestSnapshotRoundTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b, _ := snapshotStores(t)
		section, info, err := a.ExportSession(context.Background(), "t", "s", "ann")
		if err != nil {
			t.Fatal(err)
		}
		if info.Session != "s" || info.User != "ann" || info.Messages < 28 || info.Units == 0 || info.Facts != 2 || info.Triples != 2 ||
			info.Active == 0 || info.Bytes != len(section) || info.Model != "test-model" {
			t.Fatalf("export info %+v", info)
		}
		if bytes.Contains(section, []byte(`"tenant":"t"`)) {
			t.Fatal("the snapshot names the exporter's tenant")
		}
		got, err := b.ImportSession(context.Background(), "t2", "s2", "ann", section)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, info) {
			t.Fatalf("import read %+v, export wrote %+v", got, info)
		}
		va, ma, ta, wa := sessionState(t, a, "t", "s")
		vb, mb, tb, wb := sessionState(t, b, "t2", "s2")
		if !reflect.DeepEqual(va, vb) {
			t.Fatalf("history differs:\n%+v\n%+v", va, vb)
		}
		if ja, jb := mustJSON(t, ma), mustJSON(t, mb); ja != jb || len(ma.Units) == 0 {
			t.Fatalf("memory differs:\n%+v\n%+v", ma, mb)
		}
		for i := range tb {
			tb[i].ID = strings.Replace(tb[i].ID, sessionHash("t2", "s2")[:8], sessionHash("t", "s")[:8], 1)
		}
		if mustJSON(t, ta) != mustJSON(t, tb) || len(ta) != 2 {
			t.Fatalf("triples differ:\n%+v\n%+v", ta, tb)
		}
		if !reflect.DeepEqual(wa, wb) || wa == nil || len(wa.Active) == 0 {
			t.Fatalf("working memory differs:\n%+v\n%+v", wa, wb)
		}
		// The next turn: the same window and recall on both.
		q := text("user", "Which toy does Rex chase at dawn?")
		ta2, tb2 := prepare2(t, a, "t", "s", "ann", q), prepare2(t, b, "t2", "s2", "ann", q)
		if !reflect.DeepEqual(rawStrings(ta2.Messages), rawStrings(tb2.Messages)) || ta2.Stats.Recall != tb2.Stats.Recall {
			t.Fatalf("the next turn differs:\n%s\n%s", rawStrings(ta2.Messages), rawStrings(tb2.Messages))
		}
		if !strings.Contains(string(tb2.Block), "red ball") {
			t.Fatalf("the imported session does not recall its fact: %s", tb2.Block)
		}
		ta2.Complete(text("assistant", "The red ball."))
		tb2.Complete(text("assistant", "The red ball."))
		synctest.Wait()

		// The imported triples are B's session's: an operator deletes one.
		if ts, _ := b.Triples("t2", "ann", 0); len(ts) != 2 || b.DeleteTriple("t2", "ann", ts[0].ID) != nil {
			t.Fatalf("delete an imported triple: %+v", ts)
		}

		// Durable: the imported session survives a restart of B.
		dirB := b.opts.Dir
		b.Close()
		b = openBubbleStore(t, dirB, nil)
		if v, err := b.Session("t2", "s2"); err != nil || v.User != "ann" || len(v.Messages) != len(va.Messages)+2 {
			t.Fatalf("after restart: %v %d messages", err, len(v.Messages))
		}

		// Importing over a session, or for another end user, writes nothing.
		if _, err := b.ImportSession(context.Background(), "t2", "s2", "ann", section); !errors.Is(err, ErrExists) {
			t.Fatalf("import over a session: %v", err)
		}
		if _, err := b.ImportSession(context.Background(), "t2", "s3", "bob", section); !errors.Is(err, ErrUserMismatch) {
			t.Fatalf("import for another user: %v", err)
		}
		if _, err := b.Session("t2", "s3"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a refused import left a session: %v", err)
		}
		if _, err := b.CheckSnapshot(section, "ann"); err != nil {
			t.Fatal(err)
		}
		// Export is the caller's own session only.
		if _, _, err := a.ExportSession(context.Background(), "t", "s", ""); !errors.Is(err, ErrUserMismatch) {
			t.Fatalf("export without the user: %v", err)
		}
		if _, _, err := a.ExportSession(context.Background(), "t9", "s", "ann"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("export from another tenant: %v", err)
		}
	})
}

// A damaged memory section is refused whole: any flipped byte, any cut,
// and nothing is written.
func TestSnapshotDamageRefusedWhole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b, _ := snapshotStores(t)
		section, _, err := a.ExportSession(context.Background(), "t", "s", "ann")
		if err != nil {
			t.Fatal(err)
		}
		refused := func(what string, x []byte) {
			t.Helper()
			if _, err := b.ImportSession(context.Background(), "t", "d", "ann", x); !errors.Is(err, durable.ErrCorrupt) {
				t.Fatalf("%s: %v", what, err)
			}
		}
		step := max(1, len(section)/2000)
		for i := 0; i < len(section); i += step {
			x := bytes.Clone(section)
			x[i] ^= 0x20
			refused(fmt.Sprintf("byte %d flipped", i), x)
		}
		for n := 0; n < len(section); n += step {
			refused(fmt.Sprintf("cut at %d", n), section[:n])
		}
		refused("extended", append(bytes.Clone(section), 1, 2, 3))
		// Well framed but not a session: records that do not replay.
		hdr := durable.AppendRecord(nil, []byte(`{"k":"hctx","v":1,"session":"s","user":"ann"}`))
		refused("no meta", sectionOf(hdr, `{"k":"msg","seq":1}`))
		refused("bad trunc", sectionOf(hdr, `{"k":"meta","v":1,"user":"ann"}`, `{"k":"trunc","keep":5}`))
		refused("two metas", sectionOf(hdr, `{"k":"meta","v":1,"user":"ann"}`, `{"k":"meta","v":1,"user":"ann"}`))
		refused("bad link", sectionOf(durable.AppendRecord(nil, []byte(`{"k":"hctx","v":1,"user":"ann","wm":{"links":[{"a":"b","b":"a","w":0.5}]}}`)), `{"k":"meta","v":1,"user":"ann"}`))
		refused("no end", durable.AppendRecord(bytes.Clone(hdr), []byte(`{"k":"meta","v":1,"user":"ann"}`)))
		refused("wrong end", durable.AppendRecord(durable.AppendRecord(bytes.Clone(hdr), []byte(`{"k":"meta","v":1,"user":"ann"}`)), []byte(`{"k":"hctx-end","n":3}`)))
		if _, err := b.ImportSession(context.Background(), "t", "d", "ann", sectionOf(durable.AppendRecord(nil, []byte(`{"k":"hctx","v":2,"user":"ann"}`)), `{"k":"meta","v":1,"user":"ann"}`)); !errors.Is(err, ErrInvalid) {
			t.Fatalf("newer version: %v", err)
		}
		if _, err := b.Session("t", "d"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a refused import left a session: %v", err)
		}
		if st := b.Stats(); st.Sessions != 0 {
			t.Fatalf("a refused import left %d sessions loaded", st.Sessions)
		}
	})
}

// sectionOf frames records after hdr with the end record.
func sectionOf(hdr []byte, recs ...string) []byte {
	out := bytes.Clone(hdr)
	for _, r := range recs {
		out = durable.AppendRecord(out, []byte(r))
	}
	return durable.AppendRecord(out, fmt.Appendf(nil, `{"k":"hctx-end","n":%d}`, len(recs)+1))
}

// FuzzSnapshotSection: whatever the bytes, CheckSnapshot never panics,
// and a section it accepts imports.
func FuzzSnapshotSection(f *testing.F) {
	hdr := durable.AppendRecord(nil, []byte(`{"k":"hctx","v":1,"session":"s","user":"u","wm":{"active":[{"id":"msg-000000000001","t":5,"n":1}]}}`))
	f.Add(sectionOf(hdr, `{"k":"meta","v":1,"user":"u"}`, `{"k":"msg","seq":1,"msg":{"role":"user","content":"hi"}}`,
		`{"k":"unit","unit":{"id":"fact-1","type":"fact","tier":"working","content":"x","category":"fact"}}`,
		`{"k":"triple","triple":{"id":"tri-00000000-000000000001-00","subject":"a","predicate":"b","object":"c","support":["fact-1"]}}`))
	f.Add(sectionOf(hdr, `{"k":"meta","v":1,"user":"u"}`))
	f.Add([]byte("garbage"))
	s := openStore(f, f.TempDir(), nil)
	n := 0
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := s.CheckSnapshot(b, "u"); err != nil {
			return
		}
		n++
		if _, err := s.ImportSession(context.Background(), "t", fmt.Sprint("f", n), "u", b); err != nil {
			t.Fatalf("checked, yet the import failed: %v", err)
		}
	})
}

// A snapshot imported into one replica of a fleet is the fleet's: another
// replica serves the session's next turn from the shared log, and a
// snapshot of a session the fleet holds already is refused.
func TestSnapshotImportIntoFleet(t *testing.T) {
	src := openStore(t, t.TempDir(), nil)
	for i := range 3 {
		turnOn(t, src, i)
	}
	section, _, err := src.ExportSession(context.Background(), "t1", "S", "")
	if err != nil {
		t.Fatal(err)
	}
	sh := newMemLog()
	with := func(o *Options) { o.SharedLog = sh }
	a, b := openStore(t, t.TempDir(), with), openStore(t, t.TempDir(), with)
	// b held another conversation of that id, deleted since (the proxy
	// deletes the caller's session before it imports over it).
	if _, err := b.Prepare(context.Background(), TurnRequest{Tenant: "t1", SessionID: "S", Model: "m",
		Messages: []Message{text("user", "an older conversation"), text("assistant", "long gone"), text("user", "really")}}); err != nil {
		t.Fatal(err)
	}
	wantOld := func() {
		t.Helper()
		if v, err := b.Session("t1", "S"); err != nil || len(v.Messages) != 3 {
			t.Fatalf("b's copy: %v %d messages", err, len(v.Messages))
		}
	}
	wantOld()
	if err := a.Delete("t1", "S"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ImportSession(context.Background(), "t1", "S", "", section); err != nil {
		t.Fatal(err)
	}
	wantHistory(t, b, 3)
	turnOn(t, b, 3)
	wantHistory(t, b, 4)
	wantHistory(t, a, 4)
	if _, err := b.ImportSession(context.Background(), "t1", "S", "", section); !errors.Is(err, ErrExists) {
		t.Fatalf("import over the fleet's session: %v", err)
	}
}
