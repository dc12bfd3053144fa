//go:build race

package main

// raceEnabled: this test binary has the race detector, and so gets the
// sidecar binary the tests start.
const raceEnabled = true
