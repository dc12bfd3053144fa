package memory

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestPromptPrefixStableAndRecallPerTurn drives a client that sends only
// its newest message (no mode header) through topic changes with a small
// window. On every turn without eviction the previous prompt, its recall
// block aside, is a prefix of the new one message for message (the stable
// part never moves between evictions); the recall block sits right before
// the newest user message and follows the topic of each turn.
func TestPromptPrefixStableAndRecallPerTurn(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) {
		o.Window.Limit = 1200
		o.Recall.Share = 0.15
	})
	ctx := context.Background()
	topics := []string{"volcano eruptions and ash clouds", "sourdough bread and starter feeding", "chess openings like the Sicilian"}
	var prev []json.RawMessage
	var prevBlock json.RawMessage
	noEvict, evictions, onTopic, withBlock := 0, 0, 0, 0
	for n := 0; n < 60; n++ {
		topic := topics[(n/4)%len(topics)]
		msgs := []Message{NewMessage("user", fmt.Sprintf("Question %d about %s: what should I remember about %s?", n, topic, topic))}
		if n%5 == 0 {
			msgs = append([]Message{NewMessage("system", "You are a careful assistant.")}, msgs...)
		}
		turn, err := s.Prepare(ctx, TurnRequest{Tenant: "tenant", SessionID: "sticky", Model: "gpt-4o", Messages: msgs})
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 && (turn.Stats.Mode != "append" || !turn.Stats.ModeDetected) {
			t.Fatalf("turn %d taken as %s (detected %v, %s)", n, turn.Stats.Mode, turn.Stats.ModeDetected, turn.Stats.Match)
		}
		cur := turn.Messages
		last := len(cur) - 1
		if string(cur[last]) != string(msgs[len(msgs)-1].Raw) {
			t.Fatalf("turn %d: the newest user message is not last", n)
		}
		if turn.Block != nil {
			withBlock++
			if string(cur[last-1]) != string(turn.Block) {
				t.Fatalf("turn %d: the recall block is not right before the newest user message", n)
			}
			// Recalled turns of the topic asked about come first in relevance.
			head, _, _ := strings.Cut(topic, " ")
			if strings.Contains(string(turn.Block), head) {
				onTopic++
			}
		}
		if prev != nil && turn.Stats.Evicted == 0 {
			noEvict++
			var stable []json.RawMessage
			for _, m := range prev {
				if string(m) != string(prevBlock) {
					stable = append(stable, m)
				}
			}
			if p := commonPrefix(stable, cur); p.Messages != len(stable) {
				t.Fatalf("turn %d: no eviction, but only %d of the previous prompt's %d messages (recall block aside) lead the new one",
					n, p.Messages, len(stable))
			}
		}
		if turn.Stats.Evicted > 0 {
			evictions++
		}
		if err := turn.Complete(NewMessage("assistant", fmt.Sprintf("Noted %d: %s matters.", n, topic))); err != nil {
			t.Fatal(err)
		}
		prev, prevBlock = cur, turn.Block
	}
	if evictions == 0 || noEvict == 0 || withBlock == 0 {
		t.Fatalf("evictions %d, turns without eviction %d, blocks %d: the test does not exercise the window", evictions, noEvict, withBlock)
	}
	if onTopic < withBlock*3/4 {
		t.Fatalf("only %d of %d recall blocks hold the topic asked about", onTopic, withBlock)
	}
	if evictions > 12 {
		t.Fatalf("%d evictions in 60 turns: history does not leave in large steps", evictions)
	}
	t.Logf("%d evictions, %d turns without eviction, %d of %d blocks on topic", evictions, noEvict, onTopic, withBlock)
}
