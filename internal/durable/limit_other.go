//go:build !unix

package durable

// DefaultMaxOpen is 256 where the descriptor limit cannot be read.
func DefaultMaxOpen() int { return 256 }
