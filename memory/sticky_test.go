package memory

import (
	"bytes"
	"context"
	"fmt"
	"testing"
)

// TestStickyBlockKeepsPromptsExtending drives an append-mode session through
// topic changes with a small window: every prompt whose request evicted
// nothing must start with the previous prompt byte for byte (block
// included), and the block must still change at evictions.
func TestStickyBlockKeepsPromptsExtending(t *testing.T) {
	for _, refresh := range []BlockRefresh{BlockRefreshOnEvict, BlockRefreshEveryTurn} {
		t.Run(fmt.Sprint(refresh), func(t *testing.T) {
			s := openStore(t, t.TempDir(), func(o *Options) {
				o.HardLimit, o.SystemReserve, o.ToolsReserve, o.InjectMaxTokens = 900, 64, 64, 200
				o.BlockRefresh = refresh
			})
			ctx := context.Background()
			topics := []string{"volcano eruptions and ash clouds", "sourdough bread and starter feeding", "chess openings like the Sicilian"}
			var prev []byte
			extended, noEvict, evictions, blocks, blockChanges := 0, 0, 0, 0, 0
			var prevBlock []byte
			for n := 0; n < 60; n++ {
				topic := topics[(n/4)%len(topics)]
				msgs := []Message{NewMessage("user", fmt.Sprintf("Question %d about %s: what should I remember about %s?", n, topic, topic))}
				if n == 0 {
					msgs = append([]Message{NewMessage("system", "You are a careful assistant.")}, msgs...)
				}
				turn, err := s.Prepare(ctx, "tenant", "sticky", ModeAppend, "gpt-4o", msgs, 0)
				if err != nil {
					t.Fatal(err)
				}
				cur := AppendMessagesJSON(nil, turn.Messages)
				if turn.Block != nil {
					blocks++
					if prevBlock != nil && !bytes.Equal(prevBlock, turn.Block) {
						blockChanges++
					}
					prevBlock = turn.Block
				}
				if prev != nil && turn.Stats.Evicted == 0 {
					noEvict++
					if bytes.HasPrefix(cur, prev[:len(prev)-1]) {
						extended++
					} else {
						t.Logf("turn %d (recall %q) does not extend the previous prompt", n, turn.Stats.Recall)
					}
				}
				if turn.Stats.Evicted > 0 {
					evictions++
				}
				if err := turn.Complete(NewMessage("assistant", fmt.Sprintf("Noted %d: %s matters.", n, topic))); err != nil {
					t.Fatal(err)
				}
				prev = AppendMessagesJSON(nil, append(turn.Messages, mustRaw(t, fmt.Sprintf("Noted %d: %s matters.", n, topic))))
			}
			if evictions == 0 || blocks == 0 || noEvict == 0 {
				t.Fatalf("evictions %d, blocks %d, turns without eviction %d: the test does not exercise the block", evictions, blocks, noEvict)
			}
			t.Logf("%v: %d/%d turns without eviction extend the previous prompt; %d evictions, block changed %d times", refresh, extended, noEvict, evictions, blockChanges)
			if refresh == BlockRefreshOnEvict {
				if extended != noEvict {
					t.Fatalf("only %d of %d turns without eviction extend the previous prompt", extended, noEvict)
				}
				if blockChanges == 0 {
					t.Fatal("the block never changed: recall does not run at evictions")
				}
			} else if extended == noEvict {
				t.Fatal("per-turn refresh never changed the block between evictions; the comparison shows nothing")
			}
		})
	}
}

// mustRaw is the raw JSON of an assistant message.
func mustRaw(t *testing.T, content string) []byte {
	t.Helper()
	m := NewMessage("assistant", content)
	return m.Raw
}
