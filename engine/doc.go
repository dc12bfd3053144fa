// Package engine is where the proxy meets the connectors to LLM servers for
// KV: making a session's prefix KV present in the engine before a request
// is forwarded, and capturing what the engine computed afterwards. It holds
// what every connector shares, and no connector:
//
//   - Plugin and one small interface per hook (hooks.go): PreRequest
//     (Before: may rewrite the JSON body), PostResponse (After, exactly
//     once per Before), Settler, Reporter and SessionReporter (stats),
//     Forgetter, MetricsExporter (its /metrics families), ConsoleReporter
//     (its console facts, console.go) and Snapshotter (snapshot.go); and
//     one capability, NonBlocking (its client hooks never block, so they
//     may run on the front door's event loop). A connector implements
//     those it needs.
//   - Hooks, the proxy's handle on one connector: each hook it has, the
//     default of a connector that keeps nothing for each it lacks.
//   - Request, Response and the errors of the hooks (request.go); Stats,
//     Report, SessionStats, Timings and ParseTimings (stats.go); the
//     families every connector writes (metrics.go); SharedStates, a fleet's
//     store of states (shared.go).
//   - Registry and Config (registry.go): a connector is a package with a
//     Factory, registered by one line in package engine/connectors, which
//     cmd/sidecar opens by the --engine name.
//
// The connectors: engine/generic (bodies untouched, statistics and the
// background gate; engines with their own prefix cache) and
// engine/llamacpp (llama.cpp slots saved to and restored from the KV
// tiers, predictive preload, context snapshots).
//
// Invariants:
//   - Hooks never fail a request: Before returns the body to forward even
//     with an error (ErrBusy aside: a Background request that must not be
//     sent), After returns nothing and is due exactly once per Before.
//   - A connector keeps what it needs of one request in Request.State;
//     nothing of one connector is in this package.
//   - Close (io.Closer) comes after the proxy stopped forwarding and
//     before the kv.Cache's Close.
package engine
