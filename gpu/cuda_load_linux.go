//go:build linux && (amd64 || arm64)

package gpu

import (
	"fmt"

	"github.com/ebitengine/purego"
)

// loadDriver dlopens the driver library and binds every entry point with
// purego. purego.RegisterLibFunc panics on a missing symbol; a driver too
// old for one must be a typed error that selects the CPU device, so each
// symbol is looked up with Dlsym first (trying its newer names first) and
// then bound with RegisterFunc.
func loadDriver(path string) (*driver, error) {
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("%w: dlopen %s: %v", ErrNoCUDA, path, err)
	}
	d := &driver{lib: path}
	for _, s := range d.symbols() {
		bound := false
		for _, name := range s.names {
			sym, err := purego.Dlsym(h, name)
			if err != nil || sym == 0 {
				continue
			}
			purego.RegisterFunc(s.fptr, sym)
			bound = true
			break
		}
		if !bound && !s.optional {
			// Leave h open: another path may name the same library, and
			// dlclose of a half-used driver is not worth the risk.
			return nil, fmt.Errorf("%w: %s: symbol %s not found (driver too old?)", ErrNoCUDA, path, s.names[0])
		}
	}
	return d, nil
}
