// Package journal owns the record logs package memory keeps on disk: the
// session logs, the shared pool's logs and the reviewer's decisions logs.
// It is the one place that knows their file format; what the records mean
// is the owner's.
//
// # What it owns
//
//   - The format: the magic "KVSMLOG2", then records framed by package
//     durable (length, payload CRC-32C, header CRC-32C). Version 1 logs
//     ("KVSMLOG1", no header checksum) are converted on open (legacy.go).
//     Image builds a whole file's bytes for an atomic rewrite.
//   - Opening, creating and rewriting logs (Journal.Open, Create, Rewrite,
//     Records, ReadFirst), with the store's fsync policy (Options) and its
//     bound on open file descriptors (durable.Files).
//   - Repair accounting: every log repaired or quarantined on open, and
//     the records lost, are counted (Journal.Stats) and logged once
//     (Journal.NoteRepair, Journal.Settle).
//
// # Invariants
//
//   - A log opened by Open has been repaired: a torn tail is cut, damaged
//     records are skipped and their bytes kept under Options.Quarantine;
//     every intact record is replayed, in order. A missing file is an
//     error matching fs.ErrNotExist; only I/O errors fail.
//   - Create fsyncs the new file and its folder (unless Options.NoSync):
//     a created log never vanishes.
//   - A Log's appends are fsynced before Append returns when
//     Options.SyncAppends; Close fsyncs unless Options.NoSync.
//   - Journal holds no goroutine and no lock of its own; a Log is safe for
//     concurrent use (durable.Log), its owner serialises its records.
package journal
