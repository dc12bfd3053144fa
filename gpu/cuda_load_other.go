//go:build !(linux && (amd64 || arm64))

package gpu

import (
	"fmt"
	"runtime"
)

// loadDriver fails: the CUDA device is bound only on 64-bit Linux, where
// the driver's CUdeviceptr and size_t are 64 bits and purego can call it
// without cgo.
func loadDriver(path string) (*driver, error) {
	return nil, fmt.Errorf("%w: %s: not supported on %s/%s", ErrNoCUDA, path, runtime.GOOS, runtime.GOARCH)
}
