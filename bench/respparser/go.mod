module github.com/kvsidecar/kvsidecar/bench/respparser

go 1.26.0

require github.com/tidwall/redcon v1.6.4

require (
	github.com/tidwall/btree v1.1.0 // indirect
	github.com/tidwall/match v1.1.1 // indirect
)
