// Package admin owns the sidecar's operational surface: the admin listener
// (--admin-listen, by default 127.0.0.1 at the main port + 1000) with the
// sidecar's own /metrics, /healthz and /readyz, the operator's console
// (its page at /ui/, its JSON API under /admin/v1/, both behind
// --admin-token) and, with --admin-pprof, Go's /debug/pprof.
//
// Why a listener of its own: on the main listener every path that is not
// the sidecar's client API is the engine's (llama.cpp's web UI at /, its
// /metrics, vLLM's and SGLang's routes), forwarded as sent. Served there,
// /metrics, /ui or /debug/pprof would shadow the engine's routes of the
// same name; on a port of its own (the convention of sidecar proxies:
// Envoy's admin port, Linkerd's 4191) none does, and the operator keeps
// it on loopback. No path of this package is ever served on the main
// listener.
//
// Who wires it: cmd/sidecar, alone. The package reaches what it shows
// through small interfaces it defines (admin.go), each implemented below
// it: Front, Health and Sessions by *proxy.Server (its strict front door,
// which every connection of this listener is read through as the main
// listener's are, its request metrics, /healthz and /readyz, deleting a
// session and the counters of the windows it built), Metrics by the
// proxy's metrics over the one registry, Memory and Knowledge by
// *memory.Store, KV by *kv.Cache, Engine by *engine.Hooks, RESP by
// *respstore.Server. It imports those packages' types only; package
// proxy does not import it. Windows, the last window of recently served
// sessions, is this package's and the proxy fills it through
// proxy.Options.Windows.
//
// Files: admin.go (Options, the interfaces, Server: the listener's
// lifecycle and router, pprof), page.go (the console's page: package ui's
// embedded files under a strict content policy), api.go (the /admin/v1
// router, its checks, sessions and the KV view), memories.go (memories,
// statistics, downloads), knowledge.go (triples and reviews), resp.go
// (the RESP listener's page and the tenants list), series.go (the KV time
// series, its sampler, and Windows), thresholds.go (the design's alert
// thresholds as the KV page judges them), errors.go (OpenAI-shaped errors
// and id checks, as the proxy's).
//
// Invariants:
//   - Without Options.Token, /ui and /admin/v1 answer 404; with it, every
//     API call needs Authorization: Bearer <token> (compared in constant
//     time on its hash) and acts for the tenant it names. The page holds
//     no data: it asks for the token and keeps it in the tab.
//   - The console keeps two bounded things in memory: a ring of
//     Options.Samples KV samples, filled by a sampler goroutine that Serve
//     starts and Shutdown stops and waits for, and Windows' last windows
//     (ConsoleWindows sessions).
//   - Every request is counted in the proxy's request metrics under its
//     route (healthz, readyz, metrics, console, admin, not_found), and
//     every error is OpenAI-shaped JSON that never quotes the request.
//   - Request bodies are bounded (1 MiB, and the main listener's bound
//     when smaller).
package admin
