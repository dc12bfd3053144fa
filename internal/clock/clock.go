// Package clock is the one time source of the project's libraries: every
// Options struct that needs time takes a Clock, and nil means System.
// Tests inject a fake one or run in a testing/synctest bubble, where System
// reads the bubble's clock.
package clock

import "time"

// Clock tells time and makes timers. Implementations must be safe for
// concurrent use: background goroutines read it too.
type Clock interface {
	Now() time.Time
	// After is time.After on this clock.
	After(d time.Duration) <-chan time.Time
}

// System is the Clock backed by time.Now and time.After.
var System Clock = system{}

type system struct{}

func (system) Now() time.Time                         { return time.Now() }
func (system) After(d time.Duration) <-chan time.Time { return time.After(d) }
