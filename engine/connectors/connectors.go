// Package connectors registers the sidecar's engine connectors: one line
// each. A new connector is a package whose type implements engine.Plugin
// and the hooks it needs (package engine), with a Factory, and a line
// here; cmd/sidecar opens it by its --engine name.
package connectors

import (
	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/engine/generic"
	"github.com/kvsidecar/kvsidecar/engine/llamacpp"
)

// All are the connectors --engine can name, the default first.
var All = engine.Registry{
	{Name: generic.Name, Help: "byte-stable prefixes, stats only", Open: generic.Open},
	{Name: llamacpp.Name, Help: "slot save/restore", Open: llamacpp.Open},
}
