// Package mockup is a scripted OpenAI-compatible upstream: canned answers
// to /v1/chat/completions (streamed or not), /v1/completions,
// /v1/embeddings and /v1/models, with no model behind them.
//
// It serves two purposes. The benchmarks put it behind the sidecar where a
// real engine would only add noise (the proxy's overhead, sessions at
// scale, LoCoMo replays). And `sidecar serve --demo` runs one in-process
// when no upstream is configured or reachable, so that `make run` alone
// shows the sidecar working: with Options.Describe each answer says what
// the sidecar sent upstream (the history and recalled memory it added),
// and DemoBackground plays the model for the sidecar's own background
// calls (fact extraction, summaries) with simple rules.
//
// It imports only fasthttp and gjson, which the serving binary links
// anyway: it must stay free of benchmark-only dependencies.
package mockup
