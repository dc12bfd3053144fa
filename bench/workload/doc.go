// Package workload holds the whole-program workloads behind `sidecar bench`
// and their reports (tables, JSON, SVG plots): the cost per turn of a
// session prefix's KV (amortization, with the reference KV computer in
// refkv.go), tier latency, throughput and hit rate against Belady (kv.go),
// the Focus tier's latency on a device beside gpu/probe's bandwidth
// (gpu.go, `sidecar bench gpu`), proxy overhead against nginx
// (proxy.go), LoCoMo retrieval (recall*.go) and replay through a sidecar
// (memory.go), sessions on a real llama-server with and without the sidecar
// (sessions*.go) and a fleet of replicas sharing Redis (fleet*.go); those
// two start their llama-servers and sidecars the same way (realstack.go,
// on bench/harness/launch); bench sessions puts a recording proxy
// (bench/harness/recordup) in front of each llama-server and sorts what reached
// it into the clients' turns and the sidecar's own generations
// (owncalls.go). bench serve (serve*.go) is the one that measures the
// user's own deployment instead of starting parts: multi-turn streamed
// conversations against any OpenAI-compatible targets, with vLLM's
// benchmark_serving.py figures.
//
// It is the top floor of the main module, above everything it measures:
// only cmd/sidecar-bench (the binary behind `sidecar bench`) and tests
// import it. No serving package and not cmd/sidecar imports it (`sidecar
// gpu`'s probe is gpu/probe; `serve --kv-trace` records KV accesses through
// tiers/tracefile), so the serving binary never links its dependencies
// (gorgonia.org/tensor among them). The hit-ratio replay engine is
// cachesim; the comparison with otter's W-TinyLFU lives in bench/simulator,
// a module of its own, and bench/redisclients compares Redis clients in
// another module, so neither otter nor valkey-go enters this module.
package workload
