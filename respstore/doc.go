// Package respstore is the sidecar's RESP listener (--resp-listen): a KV
// store that vLLM and SGLang reach through LMCache's Redis clients, with
// its values in the KV tiers instead of in RAM alone.
//
// It speaks the subset of the Redis protocol those clients send, byte for
// byte: LMCache's native `resp` connector (multiprocess mode's L2 adapter:
// AUTH [user] password, then SET answered exactly "+OK\r\n", GET a bulk
// string or "$-1\r\n", EXISTS and DEL exactly ":0\r\n" or ":1\r\n"), its
// `redis://` connector (redis-py: two keys per chunk, <key>kv_bytes then
// <key>metadata), its `valkey://` connector (GLIDE: SET with EX), and what
// redis-py, go-redis, GLIDE, redis-cli and redis-benchmark send when they
// connect (HELLO 3 AUTH user pass with RESP3 replies, CLIENT SETINFO,
// SELECT, INFO, PING, CONFIG GET). Pipelined commands are answered in
// order; a command outside the subset gets Redis's "-ERR unknown command"
// and the connection stays open; a malformed request gets "-ERR Protocol
// error" and the connection is closed, as Redis does.
//
// The request parser is the package's own (proto.go, fuzzed): redcon, the
// library the project would otherwise use, buffers a whole command in a
// buffer it doubles, copies it once more, keeps the grown buffer with the
// connection and bounds no bulk length; docs/BENCHMARKS.md measures both.
// Here a value is read once from the socket into a slice of its size,
// which becomes the stored value, and a GET writes the stored slice with
// writev: no copy on either path.
//
// Values live in a kv.Cache the Server owns, under Options.Dir: Working
// (host RAM, Options.RAMBytes), the Archive (the tiers' block files: zstd
// over byte planes, CRC32C, quarantine of a file that fails its checks),
// Focus above them on a GPU, and the fleet's store with Options.Remote.
//
// Tenants: AUTH names one (a users file's account, or any credentials
// hashed as the HTTP side hashes a bearer key); without AUTH a client is
// refused unless Options.AllowAnonymous. A tenant's keys live under its
// name in the blob key: no tenant reads, finds, counts or deletes
// another's. LMCache's cache_salt (the key's last field, SaltOf) is a
// sub-namespace for quotas: each tenant, and each salt within it, is kept
// within its quota by evicting its own least recently used keys.
//
// Invariants:
//   - A reply is one of the request's own: every command is answered, in
//     order, exactly once (QUIT last).
//   - A value is served whole and as stored, or not at all: the tiers
//     check it (a corrupt or partial Archive file is quarantined and is a
//     miss), and a value is never modified after its SET.
//   - Memory per connection is bounded: 64 KiB of read buffer, the small
//     arguments of one command (4 MiB at most), and large arguments only
//     within the server's in-flight budget (MaxInflightBytes) shared by
//     all connections. Before AUTH a command holds at most 10 arguments
//     of 16 KiB.
//   - With FsyncAlways a SET is answered once its value is fsynced; with
//     FsyncBackground at most MaxUnsyncedBytes of answered values are not
//     yet on disk. Nothing else an answered SET stored is lost by kill -9,
//     and what a restart finds is served again.
//   - The Server owns its goroutines (one per connection, the persister,
//     the expiry sweeper) and its store; Close stops them and waits.
package respstore
