//go:build !unix

package main

import "time"

// processCPU is not read here: GOMAXPROCS stays the runtime's.
func processCPU() (time.Duration, bool) { return 0, false }
