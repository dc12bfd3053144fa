// Package reviewlog owns the memory reviewer's decisions logs: one per
// tenant and user, <tenant dir>/users/<hash>.rev, a journal log (a meta
// record naming the scope, then one record per decision) that keeps the
// newest Options.Size decisions and is compacted to them when it holds
// twice as many. Package memory's reviewer appends to it and serves it
// (Store.Reviews); memory.Review is its Review.
//
// Invariants: a decision is in the log (written, fsynced under the
// journal's policy) once Append returns nil; a log of another scope is
// quarantined, never read as this one's; nothing crosses tenants or
// users. Logs owns its lock and its loaded logs, and no goroutine.
package reviewlog
