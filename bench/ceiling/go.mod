module github.com/kvsidecar/kvsidecar/bench/ceiling

go 1.26.0

require (
	github.com/VictoriaMetrics/metrics v1.45.0
	github.com/tidwall/gjson v1.20.0
	github.com/valyala/fasthttp v1.74.0
)

require (
	github.com/ebitengine/purego v0.11.3 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.2.1 // indirect
	github.com/valyala/fastrand v1.1.0 // indirect
	github.com/valyala/histogram v1.2.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

require (
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/kvsidecar/kvsidecar v0.0.0
	github.com/molecule-man/go-brrr v1.0.1 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
)

replace github.com/kvsidecar/kvsidecar => ../..
