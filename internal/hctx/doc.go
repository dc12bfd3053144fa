// Package hctx reads and writes context snapshot files (".hctx"): one
// session captured whole — its memory and its engine KV states — so that
// another sidecar (its own data folder, its own engine, the same model)
// continues the conversation where it was (MemGPT design §8.1).
//
// The package owns only the container: a versioned, checksummed sequence
// of typed sections. What a section holds belongs to the package that
// writes it (memory: the session's records and working memory; engine:
// the saved slot states); the proxy assembles a file and takes one apart.
//
// # Layout (little-endian)
//
//	header   "HCTX" | u16 version (1) | u16 flags (0) | u32 section count | u32 CRC-32C of these 12 bytes
//	section  u32 kind | u32 CRC-32C of the payload | u64 payload length | payload      (count times)
//	trailer  u32 CRC-32C of every byte before it | "XTCH"
//
// # Invariants
//
//   - Parse accepts a file only whole: the header, every section and the
//     trailer check out and consume exactly the input; anything else
//     (a flipped bit anywhere, a cut at any byte, bytes appended, a
//     section repeated) is an error matching durable.ErrCorrupt, and a
//     newer version one matching ErrVersion. Nothing is half-read.
//   - Parse never panics, allocates nothing in proportion to what the
//     input claims (sections alias the input), and bounds the section
//     count (MaxSections).
//   - A section kind this version does not know is skipped after its
//     checksum passed: a newer writer may add optional sections; one that
//     changes the meaning of existing ones bumps the version.
package hctx
