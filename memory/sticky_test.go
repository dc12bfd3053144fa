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
// block included, then its reply, lead the new one message for message
// (prompts only grow between evictions, also across a restart); the recall
// block sits right before the newest user message and follows the topic
// of each turn.
func TestPromptPrefixStableAndRecallPerTurn(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) {
		o.Window.Limit = 1200
		o.Recall.Share = 0.15
	})
	ctx := context.Background()
	topics := []string{"volcano eruptions and ash clouds", "sourdough bread and starter feeding", "chess openings like the Sicilian"}
	var prev []json.RawMessage
	var prevReply Message
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
			// Prompts only grow: the previous prompt, its recall block
			// included, then its reply, lead the new one byte for byte.
			noEvict++
			if p := commonPrefix(prev, cur); p.Messages != len(prev) {
				t.Fatalf("turn %d: no eviction, but only %d of the previous prompt's %d messages lead the new one",
					n, p.Messages, len(prev))
			}
			if string(cur[len(prev)]) != string(prevReply.Raw) {
				t.Fatalf("turn %d: the previous reply does not follow the previous prompt", n)
			}
		}
		if turn.Stats.Evicted > 0 {
			evictions++
		}
		reply := NewMessage("assistant", fmt.Sprintf("Noted %d: %s matters.", n, topic))
		if err := turn.Complete(reply); err != nil {
			t.Fatal(err)
		}
		prev, prevReply = cur, reply
	}
	// The blocks are in the log: after a restart the next prompt still
	// extends the last one (unless this turn evicts).
	dir := s.opts.Dir
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, func(o *Options) {
		o.Window.Limit = 1200
		o.Recall.Share = 0.15
	})
	turn, err := s.Prepare(ctx, TurnRequest{Tenant: "tenant", SessionID: "sticky", Model: "gpt-4o", Messages: []Message{NewMessage("user", "One more question about chess openings.")}})
	if err != nil {
		t.Fatal(err)
	}
	if p := commonPrefix(prev, turn.Messages); turn.Stats.Evicted == 0 && p.Messages != len(prev) {
		t.Fatalf("after a restart only %d of the previous prompt's %d messages lead the new one", p.Messages, len(prev))
	}
	turn.Abort()
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
