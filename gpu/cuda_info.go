package gpu

import (
	"fmt"
	"os"
	"runtime"
)

// DeviceInfo describes one GPU as the driver reports it.
type DeviceInfo struct {
	// Ordinal is the index among visible GPUs (see CUDAOptions.Ordinal).
	Ordinal int `json:"ordinal"`
	// Name is cuDeviceGetName's answer, e.g. "NVIDIA H100 80GB HBM3".
	Name string `json:"name"`
	// ComputeCapability is "major.minor", e.g. "9.0".
	ComputeCapability string `json:"compute_capability"`
	// PCIBusID is "domain:bus:device.0" in hex, as nvidia-smi prints it.
	PCIBusID string `json:"pci_bus_id"`
	// TotalBytes is the GPU's memory (cuDeviceTotalMem_v2).
	TotalBytes uint64 `json:"total_bytes"`
	// FreeBytes is cuMemGetInfo_v2's free memory when it was read (0 when
	// it could not be).
	FreeBytes uint64 `json:"free_bytes"`
}

// CUDAInfo is what the driver says about this host.
type CUDAInfo struct {
	// Library is the driver library loaded.
	Library string `json:"library"`
	// DriverVersion is the CUDA version the driver supports, e.g. "13.0".
	DriverVersion string `json:"driver_version"`
	// VisibleDevices is CUDA_VISIBLE_DEVICES, or "unset".
	VisibleDevices string `json:"cuda_visible_devices"`
	// Devices are the visible GPUs by ordinal.
	Devices []DeviceInfo `json:"devices"`
}

// CUDADevices loads the driver library (empty: DefaultCUDALibrary) and
// describes every visible GPU. Reading a GPU's free memory needs a context,
// so it retains and releases each GPU's primary context in turn: cheap when
// the process uses the GPU anyway, a few hundred milliseconds and some
// device memory otherwise (use it in tools, not on a request path). Errors
// match ErrNoCUDA when there is no usable driver or GPU.
func CUDADevices(library string) (CUDAInfo, error) {
	d, err := openDriver(library)
	if err != nil {
		return CUDAInfo{}, err
	}
	info := CUDAInfo{Library: d.lib, VisibleDevices: visibleDevicesRaw()}
	if d.driverGetVersion != nil {
		var v int32
		if d.driverGetVersion(&v) == cuSuccess {
			info.DriverVersion = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
		}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var count int32
	if err := d.check("cuDeviceGetCount", d.deviceGetCount(&count)); err != nil {
		return info, fmt.Errorf("%w: %w", ErrNoCUDA, err)
	}
	if count == 0 {
		return info, fmt.Errorf("%w: no GPU visible (CUDA_VISIBLE_DEVICES=%s)", ErrNoCUDA, visibleDevicesEnv())
	}
	for i := range int(count) {
		var dev int32
		if err := d.check("cuDeviceGet", d.deviceGet(&dev, int32(i))); err != nil {
			return info, fmt.Errorf("%w: %w", ErrNoCUDA, err)
		}
		di, err := queryDevice(d, dev, i)
		if err != nil {
			return info, err
		}
		var ctx uintptr
		if d.primaryCtxRetain(&ctx, dev) == cuSuccess {
			var free, total uint64
			if d.ctxSetCurrent(ctx) == cuSuccess && d.memGetInfo(&free, &total) == cuSuccess {
				di.FreeBytes = free
			}
			d.primaryCtxRelease(dev)
		}
		info.Devices = append(info.Devices, di)
	}
	return info, nil
}

// queryDevice reads name, memory, compute capability and PCI location. It
// needs no context.
func queryDevice(d *driver, dev int32, ordinal int) (DeviceInfo, error) {
	di := DeviceInfo{Ordinal: ordinal}
	var name [256]byte
	if err := d.check("cuDeviceGetName", d.deviceGetName(&name[0], int32(len(name)), dev)); err != nil {
		return di, fmt.Errorf("gpu: cuda device %d: %w", ordinal, err)
	}
	for i, c := range name {
		if c == 0 {
			di.Name = string(name[:i])
			break
		}
	}
	if err := d.check("cuDeviceTotalMem_v2", d.deviceTotalMem(&di.TotalBytes, dev)); err != nil {
		return di, fmt.Errorf("gpu: cuda device %d: %w", ordinal, err)
	}
	attr := func(a int32) (int32, error) {
		var v int32
		return v, d.check("cuDeviceGetAttribute", d.deviceGetAttribute(&v, a, dev))
	}
	var vals [5]int32
	for i, a := range []int32{cuAttrCCMajor, cuAttrCCMinor, cuAttrPCIDomainID, cuAttrPCIBusID, cuAttrPCIDeviceID} {
		v, err := attr(a)
		if err != nil {
			return di, fmt.Errorf("gpu: cuda device %d: attribute %d: %w", ordinal, a, err)
		}
		vals[i] = v
	}
	di.ComputeCapability = fmt.Sprintf("%d.%d", vals[0], vals[1])
	di.PCIBusID = fmt.Sprintf("%04x:%02x:%02x.0", vals[2], vals[3], vals[4])
	return di, nil
}

// visibleDevicesRaw returns CUDA_VISIBLE_DEVICES, or "unset".
func visibleDevicesRaw() string {
	if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok {
		return v
	}
	return "unset"
}
