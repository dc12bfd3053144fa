package remote

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// Key layout. Every key starts with Options.Prefix and carries the tenant
// inside a hash tag ({…}), so in a Redis Cluster the keys one operation
// touches together (a session's log and its lease, a blob's manifest and
// chunks, one index space) live in
// one slot:
//
//	P:log:{T:S}            list     a session's records (S = hash of the id)
//	P:lease:{T:S}          string   the session's lease: "owner token"
//	P:b:{T:I}              string   a blob's manifest (I = the blob id)
//	P:b:{T:I}:G:N          string   chunk N of generation G of that blob
//	P:i:{T:SP}:H           string   index: prefix hash H → state id
//
// Client-chosen strings (session ids) are hashed; tenants, blob ids, index
// spaces and hashes must be plain tokens.

// hashID hashes a client-chosen string into 32 hex digits.
func hashID(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:16])
}

// checkToken accepts 1 to 200 bytes of [A-Za-z0-9_.=-].
func checkToken(what, s string) error {
	if len(s) == 0 || len(s) > 200 {
		return fmt.Errorf("remote: %s %q: want 1 to 200 bytes", what, s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-' || c == '=') {
			return fmt.Errorf("remote: %s %q: only letters, digits and _.=- are allowed", what, s)
		}
	}
	return nil
}

func (s *Store) logKey(tenant, session string) string {
	return s.opts.Prefix + ":log:{" + tenant + ":" + hashID(session) + "}"
}

func (s *Store) leaseKey(tenant, session string) string {
	return s.opts.Prefix + ":lease:{" + tenant + ":" + hashID(session) + "}"
}

func (s *Store) manifestKey(tenant, id string) string {
	return s.opts.Prefix + ":b:{" + tenant + ":" + id + "}"
}

func chunkKey(manifestKey string, gen uint64, i int) string {
	return fmt.Sprintf("%s:%016x:%d", manifestKey, gen, i)
}

func (s *Store) indexKey(tenant, space, hash string) string {
	return s.opts.Prefix + ":i:{" + tenant + ":" + space + "}:" + hash
}
