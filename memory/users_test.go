package memory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/internal/clock"
)

// ask sends one drop-in request for a user and returns its turn (aborted).
func ask(t *testing.T, s *Store, tenant, session, user, q string) *Turn {
	t.Helper()
	tr, err := s.Prepare(context.Background(), TurnRequest{Tenant: tenant, SessionID: session, UserID: user, Messages: []Message{text("user", q)}})
	if err != nil {
		t.Fatal(err)
	}
	tr.Abort()
	return tr
}

// talk records a short conversation in a session of user.
func talk(t *testing.T, s *Store, tenant, session, user string, lines ...string) {
	t.Helper()
	for i := 0; i+1 < len(lines); i += 2 {
		tr, err := s.Prepare(context.Background(), TurnRequest{Tenant: tenant, SessionID: session, UserID: user, Messages: []Message{text("user", lines[i])}})
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Complete(text("assistant", lines[i+1])); err != nil {
			t.Fatal(err)
		}
	}
}

// settle waits for the worker to index what the last turns left.
func settle(t *testing.T, s *Store, tenant, session string) {
	t.Helper()
	sess, err := s.reg.session(tenant, session, false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.reg.unpin(sess)
	s.wk.syncUser(sess) // what the worker does after a turn, done now
}

// TestUserMemoryAcrossSessions: a new session of the same user recalls the
// user's earlier sessions (their messages, whether evicted or not, and
// their facts); another user, or the same user id under another tenant,
// recalls nothing of them; the tenant's default user is a scope too.
func TestUserMemoryAcrossSessions(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	talk(t, s, "t1", "a", "ada",
		"I adopted a greyhound called Comet last spring", "Congratulations on Comet!",
		"Comet loves the beach at Brighton", "Beaches are great for greyhounds.")
	if _, err := s.AddMemory("t1", "a", CategoryFact, "Ada is allergic to walnuts.", 1); err != nil {
		t.Fatal(err)
	}
	settle(t, s, "t1", "a")

	tr := ask(t, s, "t1", "b", "ada", "What is my greyhound called and which beach does he love?")
	if !strings.Contains(string(tr.Block), "Comet") || !strings.Contains(string(tr.Block), "Brighton") || tr.Stats.CrossSession == 0 {
		t.Fatalf("a new session of the user does not recall the earlier one: %s", tr.Block)
	}
	if !strings.Contains(string(tr.Block), "another session") {
		t.Fatalf("cross-session memories not marked: %s", tr.Block)
	}
	if tr := ask(t, s, "t1", "c", "ada", "Am I allergic to anything?"); !strings.Contains(string(tr.Block), "walnuts") {
		t.Fatalf("the user's fact is not recalled in another session: %s", tr.Block)
	}
	for _, other := range []struct{ tenant, user string }{{"t1", "bob"}, {"t2", "ada"}, {"t1", ""}} {
		if tr := ask(t, s, other.tenant, "d-"+other.user, other.user, "What is my greyhound called?"); strings.Contains(string(tr.Block), "Comet") {
			t.Fatalf("tenant %s user %q recalls ada's session: %s", other.tenant, other.user, tr.Block)
		}
	}

	// Sessions that name no end user keep their memory to themselves: one
	// API key for all of an app's users must not share their words.
	talk(t, s, "t1", "e", "", "My locker code is 4471", "Noted.")
	settle(t, s, "t1", "e")
	if tr := ask(t, s, "t1", "f", "", "What is my locker code?"); strings.Contains(string(tr.Block), "4471") || tr.Stats.CrossSession != 0 {
		t.Fatalf("a session without an end user recalls another one: %s", tr.Block)
	}
	if tr := ask(t, s, "t1", "e", "", "What is my locker code?"); !strings.Contains(string(tr.Block)+strings.Join(rawStrings(tr.Messages), ""), "4471") {
		t.Fatalf("a session without an end user lost its own memory: %s", tr.Block)
	}
	// A session keeps the user it was created with: a request naming
	// another one is refused (the proxy forwards it without memory).
	_, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t1", SessionID: "a", UserID: "bob", Messages: []Message{text("user", "anything")}})
	if !errors.Is(err, ErrUserMismatch) {
		t.Fatalf("session a taken by user bob: %v", err)
	}
	if tr := ask(t, s, "t1", "a", "", "anything"); tr.Stats.User != "ada" {
		t.Fatalf("session a taken as user %q without a user named", tr.Stats.User)
	}
}

// TestTenantUserScope: with Recall.TenantUserScope the sessions that name
// no end user are one user of their tenant (the operator's choice), and
// still nothing crosses tenants or reaches a named user.
func TestTenantUserScope(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) { o.Recall.TenantUserScope = true })
	talk(t, s, "t1", "e", "", "My locker code is 4471", "Noted.")
	settle(t, s, "t1", "e")
	if tr := ask(t, s, "t1", "f", "", "What is my locker code?"); !strings.Contains(string(tr.Block), "4471") {
		t.Fatalf("the tenant scope does not recall its other session: %s", tr.Block)
	}
	for _, other := range []struct{ tenant, user string }{{"t1", "bob"}, {"t2", ""}} {
		if tr := ask(t, s, other.tenant, "g-"+other.user, other.user, "What is my locker code?"); strings.Contains(string(tr.Block), "4471") {
			t.Fatalf("tenant %s user %q recalls the tenant scope: %s", other.tenant, other.user, tr.Block)
		}
	}
}

// TestUserMemorySurvivesRestartAndRebuilds: the user index is saved on
// Close and used after a restart; when it is missing it is rebuilt from
// the logs; when it is older than a log (a crash after the log was
// written), that session is reconciled; a deleted session's memories leave.
func TestUserMemorySurvivesRestartAndRebuilds(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, nil)
	talk(t, s, "t", "a", "ada", "My sister Lena lives in Porto", "Porto is lovely.")
	// A second session: an index of one session's documents is not saved
	// (loading rebuilds it from that session's log, see saveUser).
	talk(t, s, "t", "a0", "ada", "I collect stamps", "A fine hobby.")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	path := userIndexPath(dir, "t", "ada")
	saved, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("user index not saved on Close: %v", err)
	}

	s = openStore(t, dir, nil)
	if tr := ask(t, s, "t", "b", "ada", "Where does my sister live?"); !strings.Contains(string(tr.Block), "Porto") {
		t.Fatalf("after restart: %s", tr.Block)
	}
	talk(t, s, "t", "a", "ada", "I took up pottery on Tuesdays", "Pottery is relaxing.")
	s.Close()

	// A crash lost the index's last save: the old file, older than the log.
	if err := os.WriteFile(path, saved, 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, nil)
	if tr := ask(t, s, "t", "c", "ada", "Which day do I do pottery?"); !strings.Contains(string(tr.Block), "Tuesdays") {
		t.Fatalf("a log newer than the index was not reconciled: %s", tr.Block)
	}
	s.Close()

	os.Remove(path)
	s = openStore(t, dir, nil)
	tr := ask(t, s, "t", "d", "ada", "Where does my sister Lena live, and what do I do on Tuesdays?")
	if !strings.Contains(string(tr.Block), "Porto") || !strings.Contains(string(tr.Block), "pottery") {
		t.Fatalf("missing index not rebuilt from the logs: %s", tr.Block)
	}
	if err := s.Delete("t", "a"); err != nil {
		t.Fatal(err)
	}
	if tr := ask(t, s, "t", "e", "ada", "Where does my sister Lena live?"); strings.Contains(string(tr.Block), "Porto") {
		t.Fatalf("a deleted session is still recalled: %s", tr.Block)
	}
	s.Close()
	// Deleted while the index was not loaded: the next load drops it too.
	s = openStore(t, dir, nil)
	if tr := ask(t, s, "t", "f", "ada", "Where does my sister Lena live?"); strings.Contains(string(tr.Block), "Porto") {
		t.Fatalf("a deleted session is recalled after restart: %s", tr.Block)
	}
}

// TestRetentionForgetsUserMemory: a session deleted by the retention sweep
// leaves its user's index too (loaded or not), and the sweep never takes
// the user index file for a stray session index.
func TestRetentionForgetsUserMemory(t *testing.T) {
	dir := t.TempDir()
	mod := func(o *Options) { o.Clock = clock.System; o.Storage.SessionTTL = time.Hour }
	s := openStore(t, dir, mod)
	talk(t, s, "t", "old", "ada", "My bike is a green Bianchi", "Nice bike.")
	talk(t, s, "t", "fresh", "ada", "I live in Ghent", "Lovely city.")
	settle(t, s, "t", "old")
	settle(t, s, "t", "fresh")
	if tr := ask(t, s, "t", "probe1", "ada", "What bike do I ride?"); !strings.Contains(string(tr.Block), "Bianchi") {
		t.Fatalf("not recalled before the sweep: %s", tr.Block)
	}
	// The probe's question stays in its session (Abort) and reaches the
	// user's index: indexed now, not whenever the worker gets to it, so the
	// index the second probe searches is the same every run.
	settle(t, s, "t", "probe1")
	s.recall.saveUser(s.reg.userMem("t", "ada"), true)
	long := time.Now().Add(-2 * time.Hour)
	for _, f := range []string{sessionPath(dir, "t", "old"), userIndexPath(dir, "t", "ada")} {
		if err := os.Chtimes(f, long, long); err != nil {
			t.Fatal(err)
		}
	}
	s.sweeper.Sweep(time.Now())
	if _, err := os.Stat(userIndexPath(dir, "t", "ada")); err != nil {
		t.Fatalf("the sweep removed the user index: %v", err)
	}
	tr := ask(t, s, "t", "probe2", "ada", "What bike do I ride? Where do I live?")
	if strings.Contains(string(tr.Block), "Bianchi") || !strings.Contains(string(tr.Block), "Ghent") {
		t.Fatalf("after the sweep: %s", tr.Block)
	}
}

// TestRecallNeedsCoverage: another session that shares only a frequent word
// with the question is not recalled (its tokens would be reprocessed on
// every turn for nothing); one that holds the question's words is.
func TestRecallNeedsCoverage(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	talk(t, s, "t1", "a", "ada",
		"The document about the harbour mentions ferries and lighthouses", "Ferries and lighthouses, noted.",
		"The document also lists the opening hours of the museum", "Museum hours noted.")
	talk(t, s, "t1", "b", "ada",
		"The document is long and the document is dull", "Documents can be dull.")
	settle(t, s, "t1", "a")
	settle(t, s, "t1", "b")
	tr := ask(t, s, "t1", "c", "ada", "What does the document say about ferries and lighthouses?")
	if !strings.Contains(string(tr.Block), "lighthouses") {
		t.Fatalf("the session holding the question's words is not recalled: %s", tr.Block)
	}
	if strings.Contains(string(tr.Block), "dull") {
		t.Fatalf("a session sharing only the word 'document' is recalled: %s", tr.Block)
	}
}

// TestRecallSkipsWhatTheWindowHolds: another session's message whose text
// is already in this session's window is not recalled again.
func TestRecallSkipsWhatTheWindowHolds(t *testing.T) {
	for i := range 8 { // the text hashes differ per question: several tries
		s := openStore(t, t.TempDir(), nil)
		q := fmt.Sprintf("What is item %d of the inventory list?", i)
		talk(t, s, "t1", "a", "", q, "abc def ghi")
		settle(t, s, "t1", "a")
		talk(t, s, "t1", "b", "", q, "pqr stu")
		settle(t, s, "t1", "b")
		tr := ask(t, s, "t1", "b", "", "And the inventory list, "+q)
		var blk struct{ Content string }
		if tr.Block != nil {
			if err := json.Unmarshal(tr.Block, &blk); err != nil {
				t.Fatal(err)
			}
		}
		if strings.Contains(blk.Content, "another session: "+q) {
			t.Fatalf("a question this session's window holds is recalled from another session: %s", blk.Content)
		}
	}
}

// TestUserDocsSyncedOnceAtATime: the worker, a user index loading and the
// shared log's sync may sync one session's documents at once; the user's
// per-session document counts (what hasOthers reads) stay those of the
// index.
func TestUserDocsSyncedOnceAtATime(t *testing.T) {
	for range 20 {
		s := openStore(t, t.TempDir(), nil)
		talk(t, s, "t", "a", "ada", "My bike is a green Bianchi", "Nice bike.", "I live in Ghent", "Lovely city.")
		sess, err := s.reg.session("t", "a", false)
		if err != nil {
			t.Fatal(err)
		}
		um := s.users.holdUserFor(sess, "")
		s.users.ensureUser(um, "")
		if um.index() == nil {
			s.reg.releaseUser(um)
			s.reg.unpin(sess)
			t.Fatal("no user index")
		}
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() { s.recall.syncUserDocs(sess, um) })
		}
		wg.Wait()
		n := 0
		um.index().Range(func(id string, _ index.Meta) bool {
			if docSession(id) == sess.hash {
				n++
			}
			return true
		})
		um.mu.Lock()
		counted := um.docs[sess.hash]
		um.mu.Unlock()
		s.reg.releaseUser(um)
		s.reg.unpin(sess)
		if n == 0 || counted != n {
			t.Fatalf("the index holds %d documents of the session, the count says %d", n, counted)
		}
	}
}
