package engine

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/kvsidecar/kvsidecar/kv"
)

// Config is what the wiring (cmd/sidecar) hands a connector's Factory. A
// connector reads the fields it needs and ignores the others; those of one
// connector's own flags say whose they are.
type Config struct {
	// BaseURL is the engine's root, the proxy's upstream.
	BaseURL string
	// Cache is the KV cache a connector keeps engine states in. It belongs
	// to the caller, who closes it after the connector.
	Cache *kv.Cache
	// Shared is a fleet's shared store of states (--remote); nil alone.
	Shared SharedStates
	// Logger receives the connector's warnings. Nil: slog.Default().
	Logger *slog.Logger

	// SlotDir is llamacpp's --llamacpp-slot-dir (the server's
	// --slot-save-path), Slots its --llamacpp-slots (the server's -np) and
	// Preload its --llamacpp-preload.
	SlotDir string
	Slots   int
	Preload bool
}

// Factory opens a connector.
type Factory func(Config) (Plugin, error)

// Registration names a connector for --engine.
type Registration struct {
	// Name is the --engine value, the connector's Name.
	Name string
	// Help says in a few words what it does, for the flag's help.
	Help string
	// Open opens it.
	Open Factory
}

// Registry is the connectors --engine can name, in the order its help
// lists them (package engine/connectors holds the sidecar's).
type Registry []Registration

// None is the --engine value for no connector.
const None = "none"

// Open opens the connector called name with cfg; nil for None or "".
func (r Registry) Open(name string, cfg Config) (Plugin, error) {
	if name == None || name == "" {
		return nil, nil
	}
	for _, c := range r {
		if c.Name == name {
			p, err := c.Open(cfg)
			if err != nil {
				return nil, fmt.Errorf("engine %s: %w", name, err)
			}
			return p, nil
		}
	}
	return nil, fmt.Errorf("--engine %q: want %s", name, r.names(" or "))
}

// Usage lists the connectors with their help for the flag's help text:
// "generic (…), llamacpp (…) or none".
func (r Registry) Usage() string {
	var parts []string
	for _, c := range r {
		parts = append(parts, c.Name+" ("+c.Help+")")
	}
	return strings.Join(parts, ", ") + " or " + None
}

func (r Registry) names(last string) string {
	var names []string
	for _, c := range r {
		names = append(names, c.Name)
	}
	return strings.Join(names, ", ") + last + None
}
