// A stand-in for libcuda.so.1 used by TestStubDriver: host memory plays
// device memory, copies are memcpy, streams and events are counters. It
// exists to test the purego binding itself (symbol names, argument and
// return types, the C calling convention) on hosts without a GPU; the
// device's logic is tested against the Go fake in cuda_fake_test.go.
//
// Build: cc -shared -fPIC -o libcuda.so.1 stubcuda.c
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

#define LIMIT (64ull << 20) /* device memory */

static size_t used;
static int inited;
static long ticks;

CUresult cuInit(unsigned int flags) { inited = 1; return flags == 0 ? 0 : 1; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = inited ? 1 : 0; return inited ? 0 : 3; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) { if (ordinal != 0) return 101; *d = 0; return 0; }
CUresult cuDeviceGetName(char *name, int len, CUdevice d) { strncpy(name, "Stub GPU", len); return 0; }
CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { *b = LIMIT; return 0; }
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
	switch (attr) {
	case 75: *v = 8; break;  /* compute capability 8.6 */
	case 76: *v = 6; break;
	case 33: *v = 0x3b; break; /* PCI bus */
	default: *v = 0;
	}
	return 0;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice d) { *ctx = (void *)0x1; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return 0; }
CUresult cuCtxSetCurrent(void *ctx) { return ctx == (void *)0x1 ? 0 : 201; }

/* Each allocation carries its size in front so cuMemFree can account it. */
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	if (used + n > LIMIT) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
	size_t *m = malloc(n + 16);
	if (!m) return 2;
	m[0] = n;
	used += n;
	*p = (CUdeviceptr)(uintptr_t)(m + 2);
	return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
	size_t *m = (size_t *)(uintptr_t)p - 2;
	used -= m[0];
	free(m);
	return 0;
}
CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags) { *p = malloc(n); return *p ? 0 : 2; }
CUresult cuMemFreeHost(void *p) { free(p); return 0; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s) { memcpy((void *)(uintptr_t)dst, src, n); ticks++; return s ? 0 : 400; }
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s) { memcpy(dst, (void *)(uintptr_t)src, n); ticks++; return s ? 0 : 400; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { memcpy((void *)(uintptr_t)dst, src, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { memcpy(dst, (void *)(uintptr_t)src, n); return 0; }

static long handles = 0x100;
CUresult cuStreamCreate(void **s, unsigned int flags) { *s = (void *)handles++; return flags == 1 ? 0 : 1; }
CUresult cuStreamDestroy_v2(void *s) { return 0; }
CUresult cuStreamSynchronize(void *s) { return s ? 0 : 400; }
CUresult cuEventCreate(void **e, unsigned int flags) { long *t = calloc(1, sizeof(long)); *e = t; return 0; }
CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }
CUresult cuEventRecord(void *e, void *s) { *(long *)e = ++ticks; return 0; }
CUresult cuEventSynchronize(void *e) { return 0; }
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) { *ms = 0.5f * (float)(*(long *)b - *(long *)a); return 0; }
CUresult cuMemGetInfo_v2(size_t *free, size_t *total) { *free = LIMIT - used; *total = LIMIT; return 0; }
CUresult cuGetErrorString(CUresult r, const char **s) {
	switch (r) {
	case 2: *s = "out of memory"; return 0;
	default: return 1;
	}
}
