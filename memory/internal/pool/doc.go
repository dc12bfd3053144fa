// Package pool owns the tenants' shared pools of package memory: a small
// key-value store per tenant that every session of the tenant can read and
// write (shared notes, task state, hand-offs between agents), its events
// and the view a request that opts in gets in its stable block. Package
// memory re-exports its types (memory.PoolEntry is pool.Entry) and serves
// it through Store.PoolPut, PoolGet, PoolList, PoolDelete and
// PoolSubscribe.
//
// # What it owns
//
//   - Pools (New … Close): the loaded pools, each with its lock, log,
//     entries, subscribers, remembered events and cached views. No
//     goroutine: everything runs in the caller's.
//   - One append-only log per tenant, Dir/<hash(tenant)>/pool-<hash(tenant)>.log
//     (package journal: framed and checksummed, a torn tail cut on open),
//     compacted on open when it holds more than twice the live entries.
//   - Events (events.go): every write and delete, after its record is
//     written, goes to the tenant's subscribers whose prefix matches its
//     key, in version order; a subscriber that falls Options.EventBuffer
//     behind is ended (Lagged); the newest Options.EventHistory events are
//     remembered to replay to a subscriber that reconnects.
//   - Views (view.go): what a key prefix shows of a pool, "[SHARED:key]
//     value" lines newest first, made once per pool revision and prefix.
//   - In a fleet (Options.Shared), the pool's copy of the shared log
//     (shared.go): its records are written there first, at the pool's
//     position, and other replicas' records taken from it before any call.
//
// # Invariants
//
//   - A write or delete is acknowledged only once its record is written
//     (and fsynced under the journal's policy).
//   - Versions grow with every change of a tenant's pool (deletes
//     included), so a key deleted and written again never shows an old
//     version; an entry returned is a copy the caller owns.
//   - A subscriber sees every change of its prefix in version order, or is
//     ended as Lagged; events are never reordered or silently dropped.
//   - Nothing crosses tenants: a pool's log is named by the tenant's hash
//     and its meta record names the tenant; a log of another tenant is
//     quarantined.
package pool
