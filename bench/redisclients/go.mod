module github.com/kvsidecar/kvsidecar/bench/redisclients

go 1.26.0

replace github.com/kvsidecar/kvsidecar => ../..

require (
	github.com/kvsidecar/kvsidecar v0.0.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/valkey-io/valkey-go v1.0.79
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
