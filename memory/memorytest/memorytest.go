// Package memorytest has the one helper the tests that run a sidecar with
// session memory share (package proxy's and package admin's): Open opens a
// memory.Store for a test and closes it when the test ends. Only tests
// import it; package memory's own tests cannot (it imports memory), and the
// serving binary links none of it.
package memorytest

import (
	"testing"

	"github.com/kvsidecar/kvsidecar/memory"
)

// Open opens a memory.Store with o, in a fresh folder of the test's when
// o.Dir is empty, and closes it when the test ends; an error fails the
// test.
func Open(t testing.TB, o memory.Options) *memory.Store {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	st, err := memory.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}
