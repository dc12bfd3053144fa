// Package sidecartest holds what the tests of the sidecar's listeners
// share, so that each is written once: package proxy's and package admin's
// tests drive a test sidecar over HTTP, and package respstore's and
// package admin's serve a RESP store on a loopback port.
//
//   - ServeSidecar serves a test sidecar's main and admin listeners on
//     loopback ports until the test ends; AdminURL gives the admin one's
//     URL from the main one's. What the two listeners serve is the caller's
//     (admin's tests wire a proxy.Server and an admin.Server, proxy's a
//     /metrics listener of their own), so this package imports neither.
//   - Serve serves any server with Serve(net.Listener) and Close (the RESP
//     store) on a loopback port until the test ends.
//   - ServeConns runs a handler on each connection of a loopback port:
//     a scripted peer speaking raw bytes.
//   - NoPoolClient, Post, PostWith and GetJSON are the tests' HTTP calls;
//     WantOpenAIError checks an OpenAI error envelope.
//   - RecordingUpstream is the chat upstream that echoes the last message
//     and keeps every request body.
//   - Eventually polls a condition for what lands in the background.
//
// Only tests import it: the serving binary links none of it
// (cmd/sidecar's TestServingBinaryLinksNoBenchmarkCode lists what it links).
// It imports nothing of this module, so the tests of any floor may use it.
// Every helper fails the test it is given rather than return an error, and
// ties what it starts to that test's end (t.Cleanup).
package sidecartest
