// Package durable is the one place where kvsidecar makes bytes on disk
// survive crashes. Every package that persists data (the KV archive in
// tiers, session logs and pools in memory, index files) goes through it, so
// there is one answer to "what survives kill -9 and power loss".
//
// # What it offers
//
//   - WriteAtomic / WriteFile: replace a whole file atomically (temporary
//     file in the same folder, write, fsync, rename over the target, fsync
//     the folder). Modelled on VictoriaMetrics' lib/fs MustWriteAtomic.
//   - SyncDir and MkdirAll: make folder entries durable; MkdirAll fsyncs
//     the parent of every folder it creates.
//   - A record log (Log, OpenLog, CreateLog): an append-only file of
//     CRC-framed records after a caller-chosen magic. Reading resynchronises
//     past a damaged record: every intact record is kept and only the
//     damaged bytes are skipped (and moved to quarantine on open).
//   - Files: a bound on the file descriptors the logs keep open, derived
//     from the process's RLIMIT_NOFILE; idle logs are closed (least
//     recently used first) and reopened on their next append.
//   - ErrCorrupt: the one corruption error callers match, in every
//     package (tiers, memory, remote, index). Packages keep their own
//     message through an unexported mark made with NewCorrupt, which
//     matches ErrCorrupt with errors.Is; they export no corruption
//     sentinel of their own.
//   - FS / OSFS: the small file-system interface the KV archive works
//     through, so tests can inject faults.
//
// # What survives a crash
//
//   - After WriteAtomic returns nil: the file holds exactly the new bytes,
//     across kill -9 and power loss. After it returns an error: the file
//     holds its old bytes or the new ones, never a mix; a temporary file
//     (IsTemp) may be left behind for the owner's start-up sweep.
//   - After Log.Append(…, true) returns nil: the records are on stable
//     storage. After Log.Append(…, false) returns nil: they survive kill -9
//     (they are in the kernel's page cache) but not power loss until the
//     next Log.Sync or Log.Close(true).
//   - CreateLog fsyncs the new file and its folder (and MkdirAll the
//     folders above), so a created log never vanishes.
//
// # What the caller must still do
//
//   - Fsync a folder after removing or renaming files in it itself (Remove
//     does not sync; SyncDir does).
//   - Decide the fsync policy of appends (the sync argument) and call
//     Log.Sync for deferred ones.
//   - Keep each path owned by one Log at a time: two Logs on one file
//     interleave records.
package durable
