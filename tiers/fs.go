package tiers

import "github.com/kvsidecar/kvsidecar/internal/durable"

// FS is the file system the archive works through, as small as the archive
// needs, so that tests can inject faults (short writes, failing fsyncs,
// failing renames). It is durable.FS: the archive's atomic writes go
// through durable.WriteAtomicFS.
type FS = durable.FS

// File is an open file of an FS.
type File = durable.File

// OSFS is the FS of the operating system.
type OSFS = durable.OSFS
