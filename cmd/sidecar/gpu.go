package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/kvsidecar/kvsidecar/gpu"
	"github.com/kvsidecar/kvsidecar/gpu/probe"
)

// deviceFlagUsage documents --device for every command that takes it.
const deviceFlagUsage = "device for the Focus tier: cuda (fail without a GPU), cpu, or auto (a GPU if one opens, else cpu). " +
	"CUDA_VISIBLE_DEVICES chooses which GPUs are visible; the first visible one is used"

// openDevice opens the device the --device flag names ("cpu", "cuda" or
// "auto"; empty means auto). With auto and no usable GPU it returns the CPU
// device and logs why, once, through log. The caller closes the device.
//
// A CPU device opened here caps its memory at 1 GiB (gpu.CPUOptions'
// default). A store given no device sizes its own CPU device to the Focus
// budget instead, so serve may pass nil to tiers when the kind is cpu.
func openDevice(kind string, log *slog.Logger) (gpu.Device, error) {
	k, err := gpu.ParseKind(kind)
	if err != nil {
		return nil, err
	}
	return gpu.Open(k, gpu.OpenOptions{Logger: log})
}

// gpuReport is what `sidecar gpu --json` prints.
type gpuReport struct {
	// CUDA is what the driver reports, absent when it cannot be used.
	CUDA *gpu.CUDAInfo `json:"cuda,omitempty"`
	// CUDAError says why there is no usable CUDA.
	CUDAError string `json:"cuda_error,omitempty"`
	// Requested is the --device value; Selected the kind opened.
	Requested string      `json:"requested"`
	Selected  string      `json:"selected"`
	Device    string      `json:"device"`
	Memory    gpu.MemInfo `json:"memory"`
	// Probe is the bandwidth probe on the selected device.
	Probe *probe.Report `json:"probe,omitempty"`
}

const gpuUsage = `usage: sidecar gpu [--device cpu|cuda|auto] [--probe-mib N] [--json]

Lists the GPUs the CUDA driver sees (or why it sees none), opens the device
--device selects, and probes its host<->device bandwidth, pinned and
pageable, beside a plain copy of the same bytes.
`

// cmdGPU implements `sidecar gpu`. It exits 0 when the selected device
// opened and the probe ran, 1 when either failed (--device cuda without a
// usable GPU, say), 2 on bad flags.
func cmdGPU(args []string) int {
	return runGPU(args, os.Stdout, os.Stderr, os.Getenv)
}

func runGPU(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("gpu", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, gpuUsage); fs.PrintDefaults() }
	kind := fs.String("device", "auto", deviceFlagUsage)
	probeMiB := fs.Int("probe-mib", 16, "block size of the bandwidth probe in MiB; 0 skips the probe")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if err := parseFlags(fs, args, getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "sidecar gpu:", err)
		return 2
	}
	if _, err := gpu.ParseKind(*kind); err != nil || *probeMiB < 0 {
		fmt.Fprintf(stderr, "sidecar gpu: bad --device %q or --probe-mib %d\n", *kind, *probeMiB)
		return 2
	}
	rep := gpuReport{Requested: *kind}
	if info, err := gpu.CUDADevices(""); err != nil {
		rep.CUDAError = err.Error()
	} else {
		rep.CUDA = &info
	}
	// The fallback reason is in the report already; keep the log quiet.
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dev, err := openDevice(*kind, quiet)
	if err != nil {
		writeGPUReport(stdout, rep, *asJSON)
		fmt.Fprintln(stderr, "sidecar gpu: open device:", err)
		return 1
	}
	defer dev.Close()
	rep.Selected, rep.Device = dev.Kind().String(), dev.Name()
	if rep.Memory, err = dev.MemInfo(); err != nil {
		fmt.Fprintln(stderr, "sidecar gpu: meminfo:", err)
		return 1
	}
	code := 0
	if *probeMiB > 0 {
		p, err := probe.Run(probe.Options{Device: dev, Sizes: []int{*probeMiB << 20}, Reps: 5})
		if err != nil {
			fmt.Fprintln(stderr, "sidecar gpu: probe:", err)
			code = 1
		} else {
			rep.Probe = &p
		}
	}
	if err := writeGPUReport(stdout, rep, *asJSON); err != nil {
		fmt.Fprintln(stderr, "sidecar gpu:", err)
		return 1
	}
	return code
}

func writeGPUReport(w io.Writer, r gpuReport, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	gib := func(n uint64) float64 { return float64(n) / (1 << 30) }
	if r.CUDA != nil {
		fmt.Fprintf(w, "CUDA driver %s (%s), CUDA_VISIBLE_DEVICES=%s\n", r.CUDA.DriverVersion, r.CUDA.Library, r.CUDA.VisibleDevices)
		for _, d := range r.CUDA.Devices {
			fmt.Fprintf(w, "  [%d] %s  compute %s  PCI %s  free %.1f / %.1f GiB\n",
				d.Ordinal, d.Name, d.ComputeCapability, d.PCIBusID, gib(d.FreeBytes), gib(d.TotalBytes))
		}
	} else {
		fmt.Fprintf(w, "CUDA: none usable: %s\n", r.CUDAError)
	}
	if r.Selected == "" {
		_, err := fmt.Fprintf(w, "--device %s: not opened\n", r.Requested)
		return err
	}
	fmt.Fprintf(w, "selected (--device %s): %s, %s, free %.1f / %.1f GiB\n\n", r.Requested, r.Selected, r.Device, gib(r.Memory.Free), gib(r.Memory.Total))
	if r.Probe != nil {
		return probe.WriteTable(w, *r.Probe)
	}
	return nil
}
