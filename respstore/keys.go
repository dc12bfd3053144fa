package respstore

import (
	"encoding/binary"
	"errors"
	"strings"
)

// blobNS is the kv namespace every value of the store lives in; the
// tenant and the database are in the blob key (blobKey), so one RangeBlobs
// lists the whole store when it opens.
const blobNS = "resp"

// MaxKeyLen bounds a client's key. The kv blob key also carries the
// tenant and the database, within kv.MaxBlobKeyLen (1024).
const MaxKeyLen = 900

// maxTenantLen bounds a tenant's name (users file names; hashed tenants
// are 18 bytes).
const maxTenantLen = 64

// blobKey is the kv blob key of a client's key: uvarint(len(tenant)),
// tenant, one byte of database, then the key. Length-prefixed, so no
// tenant's keys can be spelt as another's.
func blobKey(tenant string, db int, key []byte) string {
	b := make([]byte, 0, binary.MaxVarintLen64+len(tenant)+1+len(key))
	b = binary.AppendUvarint(b, uint64(len(tenant)))
	b = append(b, tenant...)
	b = append(b, byte(db))
	b = append(b, key...)
	return string(b)
}

// parseBlobKey inverts blobKey.
func parseBlobKey(k string) (tenant string, db int, key string, ok bool) {
	n, w := binary.Uvarint([]byte(k[:min(len(k), binary.MaxVarintLen64)]))
	if w <= 0 || n > maxTenantLen || uint64(len(k)) < uint64(w)+n+1 {
		return "", 0, "", false
	}
	tenant = k[w : w+int(n)]
	return tenant, int(k[w+int(n)]), k[w+int(n)+1:], true
}

// Aux kept with each value (kv.BlobMeta.Aux, in the Archive's file
// header): version 1, the value's size (u64), its expiry in Unix
// milliseconds (u64, 0 for none). With it the store's index is rebuilt on
// open from the headers alone.
const auxLen = 17

func appendAux(dst []byte, size, expiryMs int64) []byte {
	dst = append(dst, 1)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(size))
	return binary.LittleEndian.AppendUint64(dst, uint64(expiryMs))
}

var errAux = errors.New("respstore: bad value header")

func parseAux(aux []byte) (size, expiryMs int64, err error) {
	if len(aux) != auxLen || aux[0] != 1 {
		return 0, 0, errAux
	}
	return int64(binary.LittleEndian.Uint64(aux[1:])), int64(binary.LittleEndian.Uint64(aux[9:])), nil
}

// SaltOf returns the cache_salt an LMCache key carries, "" when none. It
// knows the three key shapes LMCache's clients write:
//
//   - the multiprocess mode's L2 adapters (the native `resp` connector):
//     model@kv_rank(8 hex)@group_hex@chunk_hash_hex[@cache_salt], and the
//     older model@kv_rank(8 hex)@chunk_hash_hex[@cache_salt];
//   - the `redis://` and `valkey://` connectors' CacheEngineKey:
//     model@world_size@worker_id@chunk_hash_hex@dtype[@tag%value…], the
//     salt being the tag cache_salt%<salt>; the `redis://` connector
//     appends "kv_bytes" or "metadata" to the whole key.
//
// LMCache forbids '@' in model names and salts, so the split is exact. A
// key of any other shape has no salt: its tenant's quota alone applies.
func SaltOf(key string) string {
	if !strings.Contains(key, "@") {
		return ""
	}
	parts := strings.Split(key, "@")
	if len(parts) >= 6 {
		last := len(parts) - 1
		parts[last] = trimSuffixes(parts[last])
		for _, p := range parts[5:] {
			if s, ok := strings.CutPrefix(p, "cache_salt%"); ok {
				return s
			}
		}
		return ""
	}
	if len(parts[1]) != 8 || !allHex(parts[1]) {
		return "" // a CacheEngineKey (world size in decimal) without tags
	}
	switch {
	case len(parts) == 5 && allHex(parts[2]) && allHex(parts[3]):
		return parts[4]
	case len(parts) == 4 && len(parts[2]) >= 16 && allHex(parts[2]) && !allHex(parts[3]):
		// model@rank@hash@salt (before object groups): a salt that is
		// all hex digits reads as the newer model@rank@group@hash.
		return parts[3]
	}
	return ""
}

// trimSuffixes strips the `redis://` connector's per-chunk suffix.
func trimSuffixes(s string) string {
	for _, suf := range []string{"kv_bytes", "metadata"} {
		if t, ok := strings.CutSuffix(s, suf); ok {
			return t
		}
	}
	return s
}

func allHex(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isHex(s[i]) {
			return false
		}
	}
	return true
}
