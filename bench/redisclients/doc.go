// Package redisclients compares github.com/redis/go-redis/v9 and
// github.com/valkey-io/valkey-go on the remote tier's workload against a
// real redis-server (started by the benchmark, AOF on, appendfsync
// everysec): pipelined appends of small session records, MGET of 50 to
// 2,000 prefix-hash keys, chunked SET/GET of 4 and 64 MiB blobs, a lease
// cycle (SET NX PX, Lua compare-and-renew, Lua compare-and-delete), and a
// lease renewal while another goroutine moves 64 MiB blobs through the
// same client (head-of-line blocking on a shared connection).
//
// It is its own module so the client that lost stays out of the sidecar's
// go.mod. Run it with
//
//	cd bench/redisclients && go test -run '^$' -bench . -benchmem -benchtime 2s
package redisclients
