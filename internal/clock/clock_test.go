package clock

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestSystemInBubble: System reads the bubble's clock, so code on it runs
// under testing/synctest without real time passing.
func TestSystemInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := System.Now()
		at := <-System.After(time.Hour)
		if got := System.Now().Sub(start); got != time.Hour || !at.Equal(System.Now()) {
			t.Fatalf("an hour on System took %v (fired at %v)", got, at)
		}
	})
}
