package remote

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"
)

// Options configure Open. Every zero value is a documented default; URL is
// required (Open applies EnsureDefaults and Validate).
type Options struct {
	// URL names the store:
	//   redis://[user:pass@]host:port[/db]   one server (Redis or Valkey)
	//   rediss://…                           the same over TLS
	//   redis://host1:port1?addr=host2:port2&addr=host3:port3
	//                                        a Redis Cluster (several seeds)
	// Query options the client understands (dial_timeout, read_timeout,
	// pool_size, …) pass through.
	URL string
	// Cluster forces the cluster client with a single seed address.
	// Default: a cluster when the URL names more than one address.
	Cluster bool
	// Prefix starts every key, so several deployments can share one
	// store. Default "kvs". It may not contain '{', '}' or whitespace.
	Prefix string
	// TTL is the expiry set (and refreshed) on every key written, except
	// leases, which have their own. Zero: keys never expire. Set it from
	// the retention settings (--session-ttl).
	TTL time.Duration
	// ChunkBytes is the size of one chunk of a blob. Default 4 MiB; at
	// most 256 MiB (Redis caps a value at 512 MB).
	ChunkBytes int
	// Owner is this replica's address as other replicas reach it
	// (host:port). It goes into the leases this Store takes. Default:
	// the host name.
	Owner string
	// LeaseTTL is how long a lease lives unless renewed; a crashed owner's
	// sessions are taken over after at most this long. Default 10 s.
	// Held leases are renewed every LeaseTTL/3.
	LeaseTTL time.Duration
	// Timeout bounds one small operation (a lease, an append, a lookup).
	// Blob transfers get Timeout plus one second per ChunkBytes moved.
	// Default 5 s.
	Timeout time.Duration
	// Logger receives warnings (a store without AOF, a lease lost).
	// Default slog.Default().
	Logger *slog.Logger
}

// Defaults.
const (
	DefaultPrefix     = "kvs"
	DefaultChunkBytes = 4 << 20
	MaxChunkBytes     = 256 << 20
	DefaultLeaseTTL   = 10 * time.Second
	DefaultTimeout    = 5 * time.Second
)

// EnsureDefaults fills every zero field with its documented default and
// returns o. Open calls it; calling it twice changes nothing.
func (o *Options) EnsureDefaults() *Options {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.ChunkBytes == 0 {
		o.ChunkBytes = DefaultChunkBytes
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Owner == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			h = "localhost"
		}
		o.Owner = h
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate checks options after EnsureDefaults.
func (o *Options) Validate() error {
	if o.URL == "" {
		return errors.New("remote: no URL")
	}
	u, err := url.Parse(o.URL)
	if err != nil {
		return fmt.Errorf("remote: URL: %w", err)
	}
	switch u.Scheme {
	case "redis", "rediss":
	default:
		return fmt.Errorf("remote: URL scheme %q: want redis:// or rediss://", u.Scheme)
	}
	if u.Host == "" {
		return errors.New("remote: URL has no host")
	}
	if strings.ContainsAny(o.Prefix, "{} \t\r\n") {
		return fmt.Errorf("remote: Prefix %q contains '{', '}' or whitespace", o.Prefix)
	}
	if o.ChunkBytes < 1024 || o.ChunkBytes > MaxChunkBytes {
		return fmt.Errorf("remote: ChunkBytes %d: want 1 KiB to %d", o.ChunkBytes, MaxChunkBytes)
	}
	if o.TTL < 0 || o.LeaseTTL < 0 || o.Timeout < 0 {
		return errors.New("remote: negative duration")
	}
	if o.TTL > 0 && o.TTL < time.Millisecond {
		return fmt.Errorf("remote: TTL %v below a millisecond", o.TTL)
	}
	if o.LeaseTTL < 30*time.Millisecond {
		return fmt.Errorf("remote: LeaseTTL %v below 30 ms", o.LeaseTTL)
	}
	if strings.ContainsAny(o.Owner, " \t\r\n") {
		return fmt.Errorf("remote: Owner %q contains whitespace", o.Owner)
	}
	return nil
}
