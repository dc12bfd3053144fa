package memory

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// TestSessionsAndTenantsList: the console's lists name every stored
// session of a tenant (of one user when asked), and every tenant, from the
// logs alone: a reopened store lists the same.
func TestSessionsAndTenantsList(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, nil)
	turn := func(tenant, id, user string) {
		tr, err := s.Prepare(context.Background(), TurnRequest{Tenant: tenant, SessionID: id, UserID: user, Mode: ModeAppend,
			Model: "test-model", Messages: []Message{text("user", "hello from "+id)}})
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Complete(text("assistant", "hi")); err != nil {
			t.Fatal(err)
		}
	}
	turn("tA", "a1", "alice")
	turn("tA", "a2", "bob")
	turn("tA", "a3", "alice")
	turn("tB", "b1", "")
	check := func(s *Store) {
		t.Helper()
		ids := func(l []SessionInfo) []string {
			var out []string
			for _, x := range l {
				out = append(out, x.Tenant+"/"+x.ID+"/"+x.User)
			}
			slices.Sort(out)
			return out
		}
		all, err := s.Sessions("", nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := ids(all), []string{"tA/a1/alice", "tA/a2/bob", "tA/a3/alice", "tB/b1/"}; !slices.Equal(got, want) {
			t.Fatalf("all sessions %v, want %v", got, want)
		}
		for _, x := range all {
			if x.Bytes <= 0 || x.UpdatedAt.IsZero() {
				t.Fatalf("session %+v: no size or time", x)
			}
		}
		a, _ := s.Sessions("tA", nil, 0)
		if got := ids(a); len(got) != 3 {
			t.Fatalf("tenant tA: %v", got)
		}
		alice := "alice"
		al, _ := s.Sessions("tA", &alice, 0)
		if got, want := ids(al), []string{"tA/a1/alice", "tA/a3/alice"}; !slices.Equal(got, want) {
			t.Fatalf("tA alice: %v", got)
		}
		if l, _ := s.Sessions("tA", nil, 2); len(l) != 2 {
			t.Fatalf("limit 2 gave %d", len(l))
		}
		if l, _ := s.Sessions("tC", nil, 0); len(l) != 0 {
			t.Fatalf("unknown tenant lists %v", l)
		}
		ts, err := s.Tenants()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, x := range ts {
			got[x.Tenant] = x.Sessions
		}
		if len(got) != 2 || got["tA"] != 3 || got["tB"] != 1 {
			t.Fatalf("tenants %v", ts)
		}
	}
	check(s)
	s.Close()
	check(openStore(t, dir, nil))
}

// TestUpdateMemory: text, category and importance change, the change
// survives a restart, review flags follow the importance, and the
// conversation record is not editable.
func TestUpdateMemory(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, nil)
	fact, _, core := newMemorySession(t, s)
	txt, imp, ep := "The user lives in Porto.", 2.75, CategoryEpisode
	u, err := s.UpdateMemory("t", "s", fact, MemoryEdit{Text: &txt, Importance: &imp})
	if err != nil {
		t.Fatal(err)
	}
	if u.Content != txt || u.Importance != imp || u.Review != "promote" || u.Category != CategoryFact {
		t.Fatalf("after edit: %+v", u)
	}
	if u, err = s.UpdateMemory("t", "s", core, MemoryEdit{Category: &ep}); err != nil || u.Category != CategoryEpisode || u.Type != UnitEpisode {
		t.Fatalf("category edit: %+v %v", u, err)
	}
	bad := func(id string, e MemoryEdit, want error) {
		t.Helper()
		if _, err := s.UpdateMemory("t", "s", id, e); !errors.Is(err, want) {
			t.Fatalf("edit %s %+v: %v, want %v", id, e, err, want)
		}
	}
	empty, nan, weird := "  ", -1.0, Category("gossip")
	bad(fact, MemoryEdit{Text: &empty}, ErrInvalid)
	bad(fact, MemoryEdit{Importance: &nan}, ErrInvalid)
	bad(fact, MemoryEdit{Category: &weird}, ErrInvalid)
	bad("mem-999999999999", MemoryEdit{Text: &txt}, ErrNotFound)
	mem, _ := s.Memory("t", "s")
	for _, u := range mem.Units {
		if u.Category == "" {
			bad(u.ID, MemoryEdit{Text: &txt}, ErrInvalid) // a message or reply
			break
		}
	}
	if _, err := s.UpdateMemory("t", "nope", fact, MemoryEdit{Text: &txt}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown session: %v", err)
	}
	s.Close()

	s = openStore(t, dir, nil)
	mem, err = s.Memory("t", "s")
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, u := range mem.Units {
		switch u.ID {
		case fact:
			found++
			if u.Content != txt || u.Importance != imp {
				t.Fatalf("after restart: %+v", u)
			}
		case core:
			found++
			if u.Category != CategoryEpisode {
				t.Fatalf("category after restart: %+v", u)
			}
		}
	}
	if found != 2 {
		t.Fatalf("edited memories not found after restart: %+v", mem.Units)
	}
}
