module github.com/kvsidecar/kvsidecar/bench/walk

go 1.26.0

require golang.org/x/tools v0.42.0

require (
	golang.org/x/mod v0.33.0 // indirect
	golang.org/x/sync v0.19.0 // indirect
)
