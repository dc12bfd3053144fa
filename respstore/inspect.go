package respstore

import (
	"fmt"
	"sort"

	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// Inventory is what a store's folder holds, for `sidecar inspect`.
type Inventory struct {
	// Values and Bytes count the values on disk (their size as stored by
	// SET) and FileBytes their files.
	Values    int   `json:"values"`
	Bytes     int64 `json:"bytes"`
	FileBytes int64 `json:"file_bytes"`
	// Tenants lists each tenant's keys and bytes, largest first.
	Tenants []TenantInventory `json:"tenants"`
	// Quarantined lists the files that failed their checks (moved to
	// quarantine/, never served).
	Quarantined []tiers.Quarantine `json:"quarantined"`
}

// TenantInventory is one tenant's share of an Inventory.
type TenantInventory struct {
	Tenant string `json:"tenant"`
	Keys   int    `json:"keys"`
	Bytes  int64  `json:"bytes"`
	Salts  int    `json:"salts"`
}

// Inspect reads the store under dir (a stopped sidecar's --data-dir/resp):
// every file is verified (CRC), and one that fails is moved to quarantine/
// as a start would; nothing else is written.
func Inspect(dir string) (Inventory, error) {
	c, err := kv.Open(kv.Options{Store: tiers.Options{Dir: dir, DisableFocus: true, VerifyOnOpen: true, NoFlushOnClose: true}})
	if err != nil {
		return Inventory{}, fmt.Errorf("respstore: inspect: %w", err)
	}
	by := map[string]*TenantInventory{}
	salts := map[string]map[string]bool{}
	var inv Inventory
	c.RangeBlobs(blobNS, func(bk string, m kv.BlobMeta, _ tiers.Tier) bool {
		tn, _, key, ok := parseBlobKey(bk)
		size, _, err := parseAux(m.Aux)
		if !ok || err != nil {
			return true
		}
		t := by[tn]
		if t == nil {
			t = &TenantInventory{Tenant: tn}
			by[tn], salts[tn] = t, map[string]bool{}
		}
		t.Keys++
		t.Bytes += size
		if s := SaltOf(key); s != "" {
			salts[tn][s] = true
		}
		inv.Values++
		inv.Bytes += size
		return true
	})
	inv.FileBytes = c.Store().DiskBytes()
	inv.Quarantined = c.Store().Quarantined()
	for tn, t := range by {
		t.Salts = len(salts[tn])
		inv.Tenants = append(inv.Tenants, *t)
	}
	sort.Slice(inv.Tenants, func(i, j int) bool { return inv.Tenants[i].Bytes > inv.Tenants[j].Bytes })
	if err := c.Close(); err != nil {
		return inv, fmt.Errorf("respstore: inspect: %w", err)
	}
	return inv, nil
}
