// Package kv owns KV tensors and the session KV cache.
//
// A Block is the K and V tensors of a span of tokens for every layer of a
// model (element types are package tiers' DType; a block is stored as a
// tiers.Value, whose archive format carries the checksums). A Cache keys blocks by a memory id (a
// session) and the 64-bit hash of the whole query (the stable prefix) they
// were computed for, keeps them in the fastest tier of a tiers.Store that
// holds them, and computes a missing block once however many callers ask
// at the same time (GetOrCompute). The same Cache serves the namespaced
// blob API behind PUT|GET|HEAD|DELETE /v1/kv/{namespace}/{key}.
//
// Invariants:
//   - A failed compute is never cached; a block computed for a memory id
//     that was invalidated meanwhile is not cached either.
//   - An expired block is never served, whether or not the expiry goroutine
//     has deleted it yet.
//   - A PutBlob that returned nil is fsynced in the Archive.
//   - Blocks and blobs returned by the cache share its memory: read-only.
//   - The Cache owns its store and one goroutine; Close stops and closes
//     both, writing what only memory holds to the Archive.
package kv
