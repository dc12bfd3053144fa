module github.com/kvsidecar/kvsidecar/bench/simulator

go 1.26.0

require github.com/kvsidecar/kvsidecar v0.0.0

require (
	github.com/VictoriaMetrics/metrics v1.45.0 // indirect
	github.com/valyala/fastrand v1.1.0 // indirect
	github.com/valyala/histogram v1.2.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

require (
	github.com/ebitengine/purego v0.11.3 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/maypok86/otter/v2 v2.4.0
)

replace github.com/kvsidecar/kvsidecar => ../..
