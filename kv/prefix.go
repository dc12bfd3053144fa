package kv

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"
)

// PrefixQuery returns the query that keys the KV block of a prompt prefix
// for a model: the model id and the SHA-256 of the prefix's token ids
// (little-endian int32s), so that
//
//	c.GetOrCompute(ctx, session, PrefixQuery(model, tokens), compute)
//
// caches one block per (session, model, prefix). The result is short and
// stable across processes and versions.
func PrefixQuery(model string, tokens []int32) string {
	h := sha256.New()
	var buf [4]byte
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(buf[:], uint32(t))
		h.Write(buf[:])
	}
	return "prefix:" + strconv.Itoa(len(model)) + ":" + model + ":" + hex.EncodeToString(h.Sum(nil))
}
