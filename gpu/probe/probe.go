package probe

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/kvsidecar/kvsidecar/gpu"
)

// Options configure Run. The zero value opens the device "auto" selects and
// measures bandwidth with the full repetitions, no latency (Run applies
// EnsureDefaults and Validate).
type Options struct {
	// Device is measured when set; the caller keeps owning it. Nil means
	// open one with Kind and close it afterwards.
	Device gpu.Device
	// Kind is the device kind for gpu.Open: "cpu", "cuda" or "auto".
	// Empty means "auto".
	Kind string
	// Logger receives gpu.Open's fallback line. Nil means slog.Default().
	Logger *slog.Logger
	// Quick cuts repetitions so the whole run takes seconds (under 30 s on
	// two cores with the CPU device).
	Quick bool
	// Sizes are the block sizes in bytes. Nil means 1 MiB, 16 MiB and
	// 256 MiB.
	Sizes []int
	// Reps overrides the repetitions of each bandwidth measurement and the
	// put/get pairs of each latency measurement. Zero means a per-size
	// default (fewer for larger blocks, fewer still when Quick).
	Reps int
	// Latency, when set, measures each block size after its bandwidth rows,
	// on the same device, data and repetitions: `sidecar bench gpu` passes
	// the Focus tier's put/get latency (bench/workload.FocusLatency), which
	// needs package tiers. Nil: bandwidth only, as `sidecar gpu` probes.
	Latency func(dev gpu.Device, data []byte, reps int) (Latency, error)
	// Seed makes the data reproducible. Zero means 1.
	Seed uint64
}

// EnsureDefaults fills every zero field with its documented default and
// returns o. Run calls it; calling it twice changes nothing.
func (o *Options) EnsureDefaults() *Options {
	if o.Kind == "" {
		o.Kind = gpu.OpenAuto
	}
	if o.Sizes == nil {
		o.Sizes = []int{1 << 20, 16 << 20, 256 << 20}
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	return o
}

// Validate checks options after EnsureDefaults.
func (o *Options) Validate() error {
	if _, err := gpu.ParseKind(o.Kind); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	for _, s := range o.Sizes {
		if s <= 0 {
			return fmt.Errorf("probe: block size %d", s)
		}
	}
	if o.Reps < 0 {
		return fmt.Errorf("probe: negative Reps")
	}
	return nil
}

// reps is how many times a measurement of a block of size bytes repeats:
// about 1 GiB (full) or 256 MiB (quick) moved per measurement, at least 8
// (quick: 3) and at most 400 (quick: 60) times.
func (o *Options) reps(size int) int {
	if o.Reps > 0 {
		return o.Reps
	}
	budget, least, most := 1<<30, 8, 400
	if o.Quick {
		budget, least, most = 256<<20, 3, 60
	}
	return max(least, min(most, budget/size))
}

// Report is the result of Run.
type Report struct {
	// Device and Kind name the device measured.
	Device string `json:"device"`
	Kind   string `json:"kind"`
	// GPU describes it when it is a GPU.
	GPU *gpu.DeviceInfo `json:"gpu,omitempty"`
	// Baseline names what the ratios compare with.
	Baseline  string      `json:"baseline"`
	Quick     bool        `json:"quick"`
	Latency   []Latency   `json:"focus_latency,omitempty"`
	Bandwidth []Bandwidth `json:"bandwidth"`
	Notes     []string    `json:"notes"`
	// DurationSeconds is the wall time of the run.
	DurationSeconds float64 `json:"duration_seconds"`
}

// Latency is Focus tier put and get latency for one block size: a put
// allocates on the device and copies in, a get copies out into a new host
// slice.
type Latency struct {
	BlockSize int     `json:"block_bytes"`
	Ops       int     `json:"ops"`
	PutP50Ms  float64 `json:"put_p50_ms"`
	PutP99Ms  float64 `json:"put_p99_ms"`
	GetP50Ms  float64 `json:"get_p50_ms"`
	GetP99Ms  float64 `json:"get_p99_ms"`
}

// Bandwidth is one direction of copies of one block size from or to one
// kind of host memory: the device's CopyIn/CopyOut beside the plain copy
// of the same bytes, interleaved in the same run. Rates are medians over
// Reps copies, in GB/s (10^9 bytes).
type Bandwidth struct {
	// Direction is "h2d" (CopyIn) or "d2h" (CopyOut).
	Direction string `json:"direction"`
	// Host is "pinned" (AllocHost memory: one DMA) or "pageable" (Go
	// memory: staged through pinned buffers).
	Host      string  `json:"host"`
	BlockSize int     `json:"block_bytes"`
	Reps      int     `json:"reps"`
	GBps      float64 `json:"gb_per_s"`
	PlainGBps float64 `json:"plain_gb_per_s"`
	// Ratio is GBps / PlainGBps: 1 means no overhead over the plain copy.
	Ratio float64 `json:"ratio_to_plain"`
	// EventGBps is the rate CUDA events measured on the copy's stream (GPU
	// only): the transfer without the call's host-side overhead.
	EventGBps float64 `json:"event_gb_per_s,omitempty"`
}

// The device methods the benchmark uses beyond gpu.Device, when present.
type (
	gpuPlainCopier interface {
		PlainCopyIn(dst gpu.Buffer, src []byte) error
		PlainCopyOut(dst []byte, src gpu.Buffer) error
	}
	gpuHostAllocator interface {
		AllocHost(n int) ([]byte, error)
		FreeHost(b []byte) error
	}
	gpuTimedCopier interface {
		CopyInTimed(dst gpu.Buffer, src []byte) (time.Duration, error)
		CopyOutTimed(dst []byte, src gpu.Buffer) (time.Duration, error)
	}
	gpuInfoer interface{ Info() gpu.DeviceInfo }
)

// Run measures one device: its bandwidth, and its latency when
// Options.Latency is set.
func Run(opts Options) (Report, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return Report{}, err
	}
	start := time.Now()
	dev := opts.Device
	if dev == nil {
		d, err := gpu.Open(opts.Kind, gpu.OpenOptions{Logger: opts.Logger, CPU: gpu.CPUOptions{Capacity: cpuCapacity(opts.Sizes)}})
		if err != nil {
			return Report{}, fmt.Errorf("probe: %w", err)
		}
		defer d.Close()
		dev = d
	}
	r := Report{Device: dev.Name(), Kind: dev.Kind().String(), Quick: opts.Quick}
	if in, ok := dev.(gpuInfoer); ok {
		info := in.Info()
		r.GPU = &info
	}
	_, plain := dev.(gpuPlainCopier)
	_, pinned := dev.(gpuHostAllocator)
	switch {
	case plain:
		r.Baseline = "cuMemcpyHtoD_v2 / cuMemcpyDtoH_v2 of the same host memory"
	default:
		r.Baseline = "copy() between host slices"
	}
	if !pinned {
		r.Notes = append(r.Notes, dev.Kind().String()+" device has no pinned memory: pinned rows use ordinary Go memory")
	}
	rng := rand.New(rand.NewPCG(opts.Seed, 0x9e3779b97f4a7c15))
	for _, size := range opts.Sizes {
		data := make([]byte, size)
		for i := 0; i < size; i += 8 {
			v := rng.Uint64()
			for j := 0; j < 8 && i+j < size; j++ {
				data[i+j] = byte(v >> (8 * j))
			}
		}
		rows, err := bandwidth(dev, data, opts.reps(size))
		if err != nil {
			return r, err
		}
		r.Bandwidth = append(r.Bandwidth, rows...)
		if opts.Latency != nil {
			l, err := opts.Latency(dev, data, opts.reps(size))
			if err != nil {
				return r, err
			}
			r.Latency = append(r.Latency, l)
		}
	}
	for _, b := range r.Bandwidth {
		if b.BlockSize >= 16<<20 {
			r.Notes = append(r.Notes, fmt.Sprintf("%s %s %s: %.2f× the plain copy (goal ≥ 0.9)", b.Direction, b.Host, SizeName(b.BlockSize), b.Ratio))
		}
	}
	r.DurationSeconds = time.Since(start).Seconds()
	return r, nil
}

// cpuCapacity sizes a CPU device for the largest block: a bandwidth
// buffer, then a Focus tier holding two blocks while a third is put.
func cpuCapacity(sizes []int) int64 {
	return max(1<<30, 4*int64(slices.Max(sizes)))
}

// gpuBandwidth measures both directions of one block size, from pinned and
// pageable host memory, each beside its plain copy. The two are
// interleaved rep by rep so drift (clocks, other tenants) hits both.
func bandwidth(dev gpu.Device, data []byte, reps int) ([]Bandwidth, error) {
	size := len(data)
	buf, err := dev.Alloc(size)
	if err != nil {
		return nil, fmt.Errorf("probe: alloc %s: %w", SizeName(size), err)
	}
	defer dev.Free(buf)
	pc, plain := dev.(gpuPlainCopier)
	timed, hasEvents := dev.(gpuTimedCopier)
	// The plain copy on the CPU device: between host slices.
	var shadow []byte
	if !plain {
		shadow = make([]byte, size)
		copy(shadow, data) // fault its pages in before timing
	}
	var rows []Bandwidth
	for _, host := range []string{"pinned", "pageable"} {
		mem, free, err := hostMemory(dev, host, size)
		if err != nil {
			return nil, err
		}
		copy(mem, data)
		type op struct {
			dir         string
			ours, plain func() (time.Duration, error)
		}
		ops := []op{
			{"h2d", func() (time.Duration, error) {
				if hasEvents {
					return timed.CopyInTimed(buf, mem)
				}
				return 0, dev.CopyIn(buf, mem)
			}, func() (time.Duration, error) {
				if plain {
					return 0, pc.PlainCopyIn(buf, mem)
				}
				copy(shadow, mem)
				return 0, nil
			}},
			{"d2h", func() (time.Duration, error) {
				if hasEvents {
					return timed.CopyOutTimed(mem, buf)
				}
				return 0, dev.CopyOut(mem, buf)
			}, func() (time.Duration, error) {
				if plain {
					return 0, pc.PlainCopyOut(mem, buf)
				}
				copy(mem, shadow)
				return 0, nil
			}},
		}
		for _, o := range ops {
			var ours, base, events []time.Duration
			for i := -1; i < reps; i++ { // rep -1 warms up
				t0 := time.Now()
				ev, err := o.ours()
				d := time.Since(t0)
				if err != nil {
					free()
					return nil, fmt.Errorf("probe: %s %s %s: %w", o.dir, host, SizeName(size), err)
				}
				t0 = time.Now()
				if _, err := o.plain(); err != nil {
					free()
					return nil, fmt.Errorf("probe: plain %s %s %s: %w", o.dir, host, SizeName(size), err)
				}
				b := time.Since(t0)
				if i >= 0 {
					ours, base = append(ours, d), append(base, b)
					if ev > 0 {
						events = append(events, ev)
					}
				}
			}
			row := Bandwidth{Direction: o.dir, Host: host, BlockSize: size, Reps: reps,
				GBps: rate(size, ours), PlainGBps: rate(size, base)}
			if row.PlainGBps > 0 {
				row.Ratio = row.GBps / row.PlainGBps
			}
			if len(events) > 0 {
				row.EventGBps = rate(size, events)
			}
			rows = append(rows, row)
		}
		// The d2h copies overwrote mem with the device's bytes: they must
		// be the bytes copied in.
		if !slices.Equal(mem, data) {
			free()
			return nil, fmt.Errorf("probe: %s %s round trip changed the bytes", host, SizeName(size))
		}
		if err := free(); err != nil {
			return nil, err
		}
	}
	return rows, nil
}

// hostMemory returns host memory of the kind asked and its release.
func hostMemory(dev gpu.Device, host string, size int) ([]byte, func() error, error) {
	if ha, ok := dev.(gpuHostAllocator); ok && host == "pinned" {
		mem, err := ha.AllocHost(size)
		if err != nil {
			return nil, nil, fmt.Errorf("probe: pinned %s: %w", SizeName(size), err)
		}
		return mem, func() error { return ha.FreeHost(mem) }, nil
	}
	return make([]byte, size), func() error { return nil }, nil
}

// rate is size bytes over the median duration, in GB/s.
func rate(size int, d []time.Duration) float64 {
	m := medianMs(d)
	if m <= 0 {
		return 0
	}
	return float64(size) / (m / 1e3) / 1e9
}

// SizeName writes a block size for people: "16 MiB", "64 KiB", "100 B".
func SizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.Itoa(n>>20) + " MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.Itoa(n>>10) + " KiB"
	}
	return strconv.Itoa(n) + " B"
}

// WriteTable writes r as tables for people.
func WriteTable(w io.Writer, r Report) error {
	fmt.Fprintf(w, "device: %s (%s)", r.Device, r.Kind)
	if r.GPU != nil {
		fmt.Fprintf(w, ", compute %s, PCI %s, %.1f GiB", r.GPU.ComputeCapability, r.GPU.PCIBusID, float64(r.GPU.TotalBytes)/(1<<30))
	}
	fmt.Fprintf(w, "\nbaseline: %s\n\n", r.Baseline)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if len(r.Latency) > 0 {
		fmt.Fprintf(tw, "focus latency (ms)\t\t\t\t\t\t\n")
		fmt.Fprintf(tw, "block\tops\tput p50\tput p99\tget p50\tget p99\t\n")
		for _, l := range r.Latency {
			fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t\n", SizeName(l.BlockSize), l.Ops, l.PutP50Ms, l.PutP99Ms, l.GetP50Ms, l.GetP99Ms)
		}
		fmt.Fprintf(tw, "\t\t\t\t\t\t\n")
	}
	fmt.Fprintf(tw, "bandwidth (GB/s)\t\t\t\t\t\t\t\n")
	fmt.Fprintf(tw, "dir\thost\tblock\treps\tdevice\tplain\tratio\tevents\t\n")
	for _, b := range r.Bandwidth {
		ev := "-"
		if b.EventGBps > 0 {
			ev = fmt.Sprintf("%.2f", b.EventGBps)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.2f\t%.2f\t%.2f\t%s\t\n", b.Direction, b.Host, SizeName(b.BlockSize), b.Reps, b.GBps, b.PlainGBps, b.Ratio, ev)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "- "+n)
	}
	_, err := fmt.Fprintf(w, "(%.1f s)\n", r.DurationSeconds)
	return err
}

// medianMs is the median of d (nearest rank) in milliseconds, 0 for no
// samples.
func medianMs(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[(len(s)+1)/2-1]) / 1e6
}
