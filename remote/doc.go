// Package remote is the shared tier under the local ones: a Redis or
// Valkey server (or Redis Cluster) that every replica of a fleet reads and
// writes, so any replica can serve any session and a replica that dies
// takes nothing with it. It is a library over github.com/redis/go-redis/v9
// and knows nothing of sessions' or engines' formats; it offers
//
//   - blobs (engine states, MBs to GBs) in chunks of Options.ChunkBytes,
//     each with a CRC32C, behind a manifest written last: a half-written
//     blob is never served, a damaged one fails with an error matching durable.ErrCorrupt;
//   - per-session record lists with idempotent, positioned appends (a retry
//     never duplicates, two writers never fork the list) that can be fenced
//     by the session's lease;
//   - a prefix-hash index (hash → state id) for longest-prefix lookups in
//     one MGET;
//   - session leases (SET NX PX with the owner's address; renew and release
//     only by the holder, in Lua), renewed by the Store while held.
//
// Every key starts with Options.Prefix and carries the tenant (see
// keys.go); Options.TTL expires everything but leases.
//
// # Durability
//
// Every write method returns only after the store has answered it: the
// write is applied in the store's memory and, with appendonly yes, in its
// append-only file. What that survives is the store's appendfsync setting
// (Store.Durability reports it): "always" fsyncs before answering, so an
// acknowledged write survives a crash of the store's process or machine;
// "everysec" (Redis' default) writes the AOF before answering and fsyncs
// it within about a second, so it survives kill -9 of the store but a
// machine crash may lose the last second; without AOF a restart loses
// everything since the last snapshot, and Open logs a warning. Replication
// to replicas is asynchronous and not waited for. A multi-chunk blob is
// durable once PutBlob returns (the manifest goes last); an append of more
// than 256 records is durable in steps (each atomic, a retry completes
// it).
//
// # Invariants
//
// A Store owns one goroutine (the lease renewer), stopped and waited for by
// Close. Client-chosen strings (session ids) are hashed into
// keys, never interpreted; other names must be plain tokens
// ([A-Za-z0-9_.=-], at most 200 bytes). Operations are bounded by
// Options.Timeout (blob transfers by Timeout plus a second per chunk).
package remote
