package memory

import "github.com/kvsidecar/kvsidecar/internal/durable"

// Records are framed by package durable (length, payload CRC-32C, header
// CRC-32C); see durable.AppendRecord. The log files that hold them are
// package journal's.

// appendRecord appends the framed payload to dst.
func appendRecord(dst, payload []byte) []byte { return durable.AppendRecord(dst, payload) }
