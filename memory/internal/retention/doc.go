// Package retention owns package memory's retention sweep: nothing on disk
// is kept forever unless asked. A Sweeper's goroutine walks memory's folder
// every period and
//
//   - deletes sessions (log and index) not written for Options.SessionTTL;
//   - keeps the bytes under the folder plus Options.Shared's (the KV
//     archive) under Options.MaxDiskBytes: first the shared store is
//     trimmed (it is a cache that can be recomputed), then quarantined
//     files are deleted oldest first, then the least recently written
//     sessions;
//   - deletes quarantined files older than Options.QuarantineTTL,
//     temporary files of writes that never finished (an hour old), and
//     index files whose log is gone.
//
// Invariants: the sweep runs only in the Sweeper's goroutine (or a
// caller's Sweep), never on the request path; Stop ends it and waits for
// it. Eviction is plain deletion, not quarantine, and need not be durable:
// a session that comes back after a crash is a valid session. A session is
// deleted through Options.Remove, the owner's, which skips one with a turn
// in flight or busy elsewhere until the next sweep. Pool logs and other
// files are counted but never deleted. Usage between sweeps can exceed the
// budget by what is written in one period.
package retention
