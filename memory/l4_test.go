package memory

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// l4Extractor answers merge prompts from a script: the first entry whose
// marker the prompt contains; anything else is skipped.
type l4Extractor struct {
	mu      sync.Mutex
	answers [][2]string // marker, answer
	calls   []string    // the markers of the merge prompts asked
}

func (e *l4Extractor) Extract(_ context.Context, req ExtractRequest) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if req.Kind != "l4_merge" {
		return "[SKIP]", nil
	}
	for _, a := range e.answers {
		if strings.Contains(req.Prompt, a[0]) {
			e.calls = append(e.calls, a[0])
			return a[1], nil
		}
	}
	e.calls = append(e.calls, "?")
	return "[SKIP]", nil
}

func (e *l4Extractor) callCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.calls)
}

func openL4Store(t *testing.T, dir string, ex Extractor, threshold int) *Store {
	return openBubbleStore(t, dir, func(o *Options) {
		o.Extraction.Extractor = ex
		o.Extraction.Every, o.Extraction.EpisodeEvery = -1, -1
		o.L4 = L4Options{Enabled: true, Threshold: threshold}
	})
}

func sessionFacts(t *testing.T, s *Store, session string) map[string]Unit {
	t.Helper()
	mem, err := s.Memory("t", session)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]Unit{}
	for _, u := range mem.Units {
		if u.Category == CategoryFact {
			out[u.ID] = u
		}
	}
	return out
}

// mergedWith returns the merged fact whose text is text.
func mergedWith(t *testing.T, facts map[string]Unit, text string) Unit {
	t.Helper()
	for _, u := range facts {
		if u.Content == text {
			if u.Merged == nil {
				t.Fatalf("%s carries no merge figures: %+v", u.ID, u)
			}
			return u
		}
	}
	t.Fatalf("no fact %q among %v", text, facts)
	return Unit{}
}

// l4Case is one language's script: three clusters and two lone facts.
type l4Case struct {
	session string
	// keep: a merge that keeps every keyword; lossy: one that loses some
	// but still reaches the fidelity threshold; refuse: one that loses
	// most, below it.
	keep, lossy, refuse                []string
	alone                              []string
	keepMerge, lossyMerge, refuseMerge string
	lossyLost, refuseLost              []string
	markers                            [3]string // a word of each cluster's prompt
}

var l4Cases = []l4Case{{
	session: "en",
	keep: []string{
		"The user deploys the api_server with HTTP_PROXY set in config.yaml on Kubernetes.",
		"The user deploys the api_server with HTTP_PROXY set in config.yaml on Kubernetes daily.",
		"The user deploys the api_server with HTTP_PROXY set in config.yaml on Kubernetes clusters.",
	},
	keepMerge: "The user deploys the api_server with HTTP_PROXY set in config.yaml on Kubernetes clusters daily.",
	lossy: []string{
		"The user's cat Tom likes tuna and sleeps on the sofa in Berlin.",
		"The user's cat Tom likes salmon and sleeps on the sofa in Berlin.",
		"The user's cat Tom likes sardines and sleeps on the sofa in Berlin.",
	},
	lossyMerge: "The user's cat likes tuna, salmon and sardines and sleeps on the sofa in Berlin.",
	lossyLost:  []string{"Tom"},
	refuse: []string{
		"The user flies to Tokyo with Japan Airlines every March.",
		"The user flies to Tokyo with Japan Airlines every March for work.",
		"The user flies to Tokyo with Japan Airlines every March to see family.",
	},
	refuseMerge: "The user travels.",
	refuseLost:  []string{"Airlines", "Japan", "Japan Airlines", "March", "Tokyo"},
	alone:       []string{"The user works in Paris as a teacher.", "The user prefers window seats on long flights."},
	markers:     [3]string{"api_server", "Tom", "Tokyo"},
}, {
	session: "zh",
	keep: []string{
		"用户在北京的公司用Kubernetes部署api_server服务，每天一次。",
		"用户在北京的公司用Kubernetes部署api_server服务，很稳定。",
		"用户在北京的公司用Kubernetes部署api_server服务。",
	},
	keepMerge: "用户在北京的公司用Kubernetes部署api_server服务，每天一次，很稳定。",
	// "喜欢吃金枪鱼、三文鱼和沙丁鱼" no longer holds the segments
	// "喜欢吃三文鱼" and "喜欢吃沙丁鱼": lost, and still kept.
	lossy: []string{
		"用户的猫叫汤姆，喜欢吃金枪鱼，住在柏林。",
		"用户的猫叫汤姆，喜欢吃三文鱼，住在柏林。",
		"用户的猫叫汤姆，喜欢吃沙丁鱼，住在柏林。",
	},
	lossyMerge: "用户的猫叫汤姆，喜欢吃金枪鱼、三文鱼和沙丁鱼，住在柏林。",
	lossyLost:  []string{"喜欢吃三文鱼", "喜欢吃沙丁鱼"},
	refuse: []string{
		"用户每年三月乘坐日本航空去东京旅行。",
		"用户每年三月乘坐日本航空去东京出差。",
		"用户每年三月乘坐日本航空去东京探亲。",
	},
	refuseMerge: "用户喜欢旅行。",
	refuseLost:  []string{"东京出差", "东京探亲", "东京旅行", "用户每年三月乘坐日本航空"},
	alone:       []string{"用户是巴黎的一名老师。", "用户喜欢靠窗的座位。"},
	markers:     [3]string{"api_server", "汤姆", "东京"},
}}

// TestL4CompressionWithFidelity: past the threshold, each cluster goes to
// the memory model; a merge that keeps its keywords, and one that loses a
// few but still reaches the fidelity threshold, replace their originals
// and carry their figures; one that loses most is refused and the
// originals stay. Refused clusters are not asked again, after a restart
// either; merged facts survive it. In English and Chinese.
func TestL4CompressionWithFidelity(t *testing.T) {
	for _, c := range l4Cases {
		t.Run(c.session, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ex := &l4Extractor{answers: [][2]string{
					{c.markers[0], "[MERGE] " + c.keepMerge},
					{c.markers[1], "[MERGE] " + c.lossyMerge},
					{c.markers[2], "[MERGE] " + c.refuseMerge},
				}}
				dir := t.TempDir()
				all := slices.Concat(c.alone, c.keep, c.lossy, c.refuse)
				s := openL4Store(t, dir, ex, 5)
				prepare(t, s, "t", c.session, ModeAppend, text("user", "hello")).Complete(text("assistant", "hi"))
				synctest.Wait()
				ids := map[string]string{}
				for i, txt := range all {
					u, err := s.AddMemory("t", c.session, CategoryFact, txt, 1+float64(i)/10)
					if err != nil {
						t.Fatal(err)
					}
					ids[txt] = u.ID
					synctest.Wait()
				}
				if n := ex.callCount(); n != 3 {
					t.Fatalf("%d merge calls, want 3 (one per cluster): %v", n, ex.calls)
				}
				facts := sessionFacts(t, s, c.session)
				check := func(facts map[string]Unit) {
					t.Helper()
					keep := mergedWith(t, facts, c.keepMerge)
					if m := keep.Merged; m.KeywordRetention != 1 || len(m.LostKeywords) != 0 || m.Fidelity < 0.5 ||
						math.Abs(m.Fidelity-(0.6*m.Similarity+0.4*m.KeywordRetention)) > 1e-3 || len(m.From) != 3 {
						t.Fatalf("keep merge figures %+v", m)
					}
					lossy := mergedWith(t, facts, c.lossyMerge)
					if m := lossy.Merged; !slices.Equal(m.LostKeywords, c.lossyLost) || m.KeywordRetention >= 1 || m.Fidelity < 0.5 {
						t.Fatalf("lossy merge figures %+v", m)
					}
					if lossy.Importance != 1+float64(len(c.alone)+len(c.keep)+2)/10 || lossy.Category != CategoryFact {
						t.Fatalf("lossy merge takes the most important original's importance: %+v", lossy)
					}
					for _, txt := range slices.Concat(c.keep, c.lossy) {
						if _, ok := facts[ids[txt]]; ok {
							t.Fatalf("original %q kept after its merge", txt)
						}
					}
					for _, txt := range slices.Concat(c.refuse, c.alone) {
						if u, ok := facts[ids[txt]]; !ok || u.Content != txt {
							t.Fatalf("original %q lost", txt)
						}
					}
					if len(facts) != len(c.alone)+len(c.refuse)+2 {
						t.Fatalf("%d facts left: %v", len(facts), facts)
					}
				}
				check(facts)
				st := s.Stats()
				if st.L4Merged != 2 || st.L4Rejected != 1 || st.L4FactsMerged != 6 || st.L4Calls != 3 || st.L4Errors != 0 || st.L4Malformed != 0 {
					t.Fatalf("stats %+v", st.L4Stats)
				}

				// A new fact changes the set: a run, but the refused cluster is
				// not asked again.
				runs := st.L4Runs
				if _, err := s.AddMemory("t", c.session, CategoryFact, "filler one", 1); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				if n := ex.callCount(); n != 3 || s.Stats().L4Runs != runs+1 {
					t.Fatalf("the refused cluster was asked again: %v (runs %d → %d)", ex.calls, runs, s.Stats().L4Runs)
				}
				s.Close()

				s = openL4Store(t, dir, ex, 5)
				facts = sessionFacts(t, s, c.session)
				delete(facts, mustFind(t, facts, "filler one"))
				check(facts)
				if _, err := s.AddMemory("t", c.session, CategoryFact, "filler two", 1); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				if n := ex.callCount(); n != 3 || s.Stats().L4Runs != 1 {
					t.Fatalf("after a restart: calls %v, runs %d", ex.calls, s.Stats().L4Runs)
				}
			})
		})
	}
}

func mustFind(t *testing.T, facts map[string]Unit, text string) string {
	t.Helper()
	for id, u := range facts {
		if u.Content == text {
			return id
		}
	}
	t.Fatalf("no fact %q", text)
	return ""
}

// TestL4MalformedStaleAndTriples: a malformed answer changes nothing; a
// merge whose originals changed meanwhile is not applied; a kept merge
// takes over the triples of the facts it replaced.
func TestL4MalformedStaleAndTriples(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		var mu sync.Mutex
		answer := "I merged them: [MERGE] x"
		ex := ExtractorFunc(func(ctx context.Context, req ExtractRequest) (string, error) {
			if req.Kind != "l4_merge" {
				return "[SKIP]", nil
			}
			select {
			case <-gate:
			case <-ctx.Done():
				return "", ctx.Err()
			}
			mu.Lock()
			defer mu.Unlock()
			return answer, nil
		})
		s := openL4Store(t, t.TempDir(), ex, 3)
		prepare(t, s, "t", "s", ModeAppend, text("user", "hello")).Complete(text("assistant", "hi"))
		synctest.Wait()
		c := l4Cases[0]
		var ids []string
		for _, txt := range slices.Concat(c.alone, c.keep) {
			u, err := s.AddMemory("t", "s", CategoryFact, txt, 1)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, u.ID)
		}
		synctest.Wait() // the run waits at the gate
		gate <- struct{}{}
		synctest.Wait()
		if st := s.Stats(); st.L4Malformed != 1 || st.L4Merged != 0 || len(sessionFacts(t, s, "s")) != 5 {
			t.Fatalf("malformed answer: %+v", st.L4Stats)
		}

		// Stale: an original is edited while the model merges.
		mu.Lock()
		answer = "[MERGE] " + c.keepMerge
		mu.Unlock()
		if _, err := s.AddMemory("t", "s", CategoryFact, c.keep[0]+" Really.", 1); err != nil {
			t.Fatal(err) // a fourth member: a new cluster, a new run
		}
		synctest.Wait()
		edited := "The user deploys the api_server with HTTP_PROXY set in config.yaml on Kubernetes weekly."
		if _, err := s.UpdateMemory("t", "s", ids[2], MemoryEdit{Text: &edited}); err != nil {
			t.Fatal(err)
		}
		gate <- struct{}{}
		synctest.Wait()
		if st := s.Stats(); st.L4Stale != 1 || st.L4Merged != 0 {
			t.Fatalf("stale merge: %+v", st.L4Stats)
		}

		// Triples move to the merged fact. The edit started another run.
		sess, _ := s.reg.session("t", "s", false)
		sess.mu.Lock()
		sess.kb.Put(&Triple{ID: "tri-1", Subject: "user", Predicate: "deploys", Object: "api_server", Support: []string{ids[3]}})
		sess.kb.MarkDirty("tri-1")
		sess.mu.Unlock()
		s.reg.unpin(sess)
		gate <- struct{}{}
		synctest.Wait()
		if st := s.Stats(); st.L4Merged != 1 {
			t.Fatalf("merge after the edit: %+v", st.L4Stats)
		}
		merged := mergedWith(t, sessionFacts(t, s, "s"), c.keepMerge)
		ts, err := s.Triples("t", "", 0)
		if err != nil || len(ts) != 1 || !slices.Equal(ts[0].Support, []string{merged.ID}) {
			t.Fatalf("triples %+v, %v; want one resting on %s", ts, err, merged.ID)
		}
		close(gate)
	})
}

// TestL4WithoutEmbeddingsKeepsTheMostImportant: with the index off there
// are no embeddings: the Threshold most important facts stay, without a
// model call.
func TestL4WithoutEmbeddingsKeepsTheMostImportant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := &l4Extractor{}
		dir := t.TempDir()
		open := func() *Store {
			return openBubbleStore(t, dir, func(o *Options) {
				o.Extraction.Extractor = ex
				o.Extraction.Every, o.Extraction.EpisodeEvery = -1, -1
				o.Recall.IndexDisabled = true
				o.L4 = L4Options{Enabled: true, Threshold: 4}
			})
		}
		s := open()
		prepare(t, s, "t", "s", ModeAppend, text("user", "hello")).Complete(text("assistant", "hi"))
		synctest.Wait()
		imps := []float64{0.9, 2, 0.3, 1.5, 1.1, 0.7}
		for i, imp := range imps {
			if _, err := s.AddMemory("t", "s", CategoryFact, "fact number "+string(rune('A'+i)), imp); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second) // distinct change times
			synctest.Wait()
		}
		got := func(s *Store) []string {
			var out []string
			for _, u := range sessionFacts(t, s, "s") {
				out = append(out, u.Content)
			}
			slices.Sort(out)
			return out
		}
		// At five facts C (0.3) went, at six F (0.7).
		want := []string{"fact number A", "fact number B", "fact number D", "fact number E"}
		if g := got(s); !slices.Equal(g, want) {
			t.Fatalf("kept %q, want %q", g, want)
		}
		if st := s.Stats(); st.L4FactsPruned != 2 || st.L4Calls != 0 || ex.callCount() != 0 {
			t.Fatalf("stats %+v", st.L4Stats)
		}
		s.Close()
		if g := got(open()); !slices.Equal(g, want) {
			t.Fatalf("after a restart %q", g)
		}
	})
}
