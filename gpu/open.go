package gpu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
)

// Device kinds Open accepts, as the --device flag spells them.
const (
	OpenCPU  = "cpu"
	OpenCUDA = "cuda"
	OpenAuto = "auto"
)

// OpenOptions configure Open. The zero value opens with default options
// and logs through slog.Default (Open applies EnsureDefaults; NewCPU and
// NewCUDA validate their own).
type OpenOptions struct {
	CPU  CPUOptions
	CUDA CUDAOptions
	// Logger receives the one line saying why "auto" fell back to the CPU.
	// Nil means slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills every zero field with its documented default, CPU's
// and CUDA's included, and returns o. Open calls it; calling it twice
// changes nothing.
func (o *OpenOptions) EnsureDefaults() *OpenOptions {
	o.CPU.EnsureDefaults()
	o.CUDA.EnsureDefaults()
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// fallbackLogged makes "auto" explain a CPU fallback once per process: a
// store, a bench and a probe may each open a device, and one line saying
// why there is no GPU is enough.
var fallbackLogged atomic.Bool

// Open opens a device by kind:
//
//   - "cpu": the CPU device.
//   - "cuda": the GPU CUDAOptions selects; any failure is returned (it
//     matches ErrNoCUDA when there is no usable driver or GPU, and
//     ErrOutOfMemory when the GPU cannot hold the device's staging buffers).
//   - "auto" or "": the GPU if it opens, else the CPU device. The reason for
//     falling back is logged once per process: at Info when there is no
//     usable CUDA (expected on CPU hosts), at Warn when a GPU is there but
//     failed to open. Only an invalid CPUOptions makes "auto" fail.
//
// The caller owns the device and closes it.
func Open(kind string, opts OpenOptions) (Device, error) {
	opts.EnsureDefaults()
	switch kind {
	case OpenCPU:
		return NewCPU(opts.CPU)
	case OpenCUDA:
		return NewCUDA(opts.CUDA)
	case OpenAuto, "":
		d, err := NewCUDA(opts.CUDA)
		if err == nil {
			return d, nil
		}
		cpu, cerr := NewCPU(opts.CPU)
		if cerr != nil {
			return nil, cerr
		}
		if !fallbackLogged.Swap(true) {
			level := slog.LevelInfo
			if !errors.Is(err, ErrNoCUDA) {
				level = slog.LevelWarn
			}
			opts.Logger.Log(context.Background(), level, "gpu: CUDA device unavailable, using the CPU device", "reason", err.Error())
		}
		return cpu, nil
	default:
		return nil, fmt.Errorf("gpu: unknown device kind %q (want cpu, cuda or auto)", kind)
	}
}

// ParseKind checks a --device value; it returns "auto" for "".
func ParseKind(s string) (string, error) {
	switch s {
	case OpenCPU, OpenCUDA, OpenAuto:
		return s, nil
	case "":
		return OpenAuto, nil
	}
	return "", fmt.Errorf("gpu: unknown device kind %q (want cpu, cuda or auto)", s)
}
