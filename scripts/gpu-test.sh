#!/usr/bin/env bash
# gpu-test.sh: build the CUDA-capable test and bench binaries here and run
# them on a GPU host that has the NVIDIA driver (libcuda.so.1) but no Go
# toolchain.
#
# Everything is built with CGO_ENABLED=0: the CUDA driver API is bound at run
# time with purego (DESIGN.md, GPU), so the same binaries run here, where the
# CUDA tests skip saying why, and on a GPU host, where they run. They link
# libc dynamically (purego needs dlopen), so the host needs glibc, as every
# CUDA host has.
#
#   scripts/gpu-test.sh build        # here: fills out/ (git-ignored)
#   scripts/gpu-test.sh run [flags]  # on the GPU host, from the repository root;
#                                    # flags go to `sidecar bench gpu` (e.g. --full)
#
# out/ holds, stripped:
# (each gzipped, so that the five and the working tree fit the 64 MiB a device
# machine's `carry` takes)
#   gpu.test       gpu package tests; the CUDA ones run on a GPU
#   tiers.test     tiers tests (Focus tier on a device that runs out of memory)
#   workload.test  bench/workload tests; TestRunGPUOnCUDA logs the GPU benchmark tables
#                  (KVSIDECAR_BENCH_FULL=1 for the full run)
#   sidecar        the sidecar binary, and sidecar-bench, what `sidecar bench` runs
#
# On this project's device machine: run the command
#   bash scripts/gpu-test.sh run
# with carry ["out"]. On any other GPU host copy the working tree and out/,
# then the same command, or by hand:
#
#   gunzip -k out/*.gz
#   (cd gpu   && ../out/gpu.test   -test.v -test.run CUDA)
#   (cd bench/workload && ../../out/workload.test -test.v -test.run TestRunGPUOnCUDA)
#   ./out/sidecar gpu --device cuda
#   ./out/sidecar bench gpu --device cuda --full --json
#   CUDA_VISIBLE_DEVICES=1 ./out/sidecar gpu    # another GPU
#
# Test binaries run in their package's folder: tests read testdata/. `run`
# sets KVSIDECAR_REQUIRE_GPU=1, so a CUDA test that finds no usable device
# fails instead of skipping: on a GPU host that is the failure being looked
# for.
set -euo pipefail

cd "$(dirname "$0")/.."
OUT=${OUT_DIR:-out}

build() {
	rm -rf "$OUT"
	mkdir -p "$OUT"
	export CGO_ENABLED=0
	local p
	for p in gpu tiers bench/workload; do
		echo "build $OUT/${p##*/}.test"
		go test -c -trimpath -ldflags='-s -w' -o "$OUT/${p##*/}.test" "./$p/"
		gzip -f "$OUT/${p##*/}.test"
	done
	for p in sidecar sidecar-bench; do
		echo "build $OUT/$p.gz"
		go build -trimpath -ldflags='-s -w' -o "$OUT/$p" "./cmd/$p/"
		gzip -f "$OUT/$p"
	done
	ls -l "$OUT"
	du -sh "$OUT"
}

run() {
	local out tmp log
	out=$(realpath "$OUT")
	tmp=$(mktemp -d)
	trap "rm -rf '$tmp'" EXIT
	for f in gpu.test tiers.test workload.test sidecar sidecar-bench; do
		[[ -f "$out/$f.gz" ]] || { echo "missing $out/$f.gz: run 'scripts/gpu-test.sh build' first" >&2; exit 1; }
		gunzip -c "$out/$f.gz" >"$tmp/$f"
		chmod +x "$tmp/$f"
	done
	out=$tmp
	if command -v nvidia-smi >/dev/null; then
		nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv || true
	fi

	# A CUDA test that cannot open the device fails instead of skipping.
	export KVSIDECAR_REQUIRE_GPU=1
	echo "== gpu: CUDA tests"
	log="$tmp/gpu.log"
	(cd gpu && "$out/gpu.test" -test.v -test.count=1 -test.run CUDA) | tee "$log"
	if grep -q -- '--- SKIP' "$log"; then
		echo "CUDA tests skipped on a host that should have a GPU" >&2
		exit 1
	fi
	echo "== gpu: staging copy benchmark"
	(cd gpu && "$out/gpu.test" -test.run '^$' -test.bench ParallelCopy -test.benchtime 300x)
	echo "== gpu, tiers: all tests"
	(cd gpu && "$out/gpu.test" -test.count=1)
	(cd tiers && "$out/tiers.test" -test.count=1)
	echo "== bench/workload: GPU benchmark"
	(cd bench/workload && "$out/workload.test" -test.v -test.count=1 -test.run GPU)
	echo "== sidecar gpu"
	"$tmp/sidecar" gpu --device cuda || echo "(sidecar gpu failed)"
	echo "== sidecar bench gpu $*"
	"$tmp/sidecar" bench gpu --device cuda "$@" || echo "(sidecar bench gpu failed)"
	echo "== KV API through the binary, Focus on cuda, then on cpu"
	SC="$tmp/sidecar" bash scripts/gpu-kv-e2e.sh cuda
	SC="$tmp/sidecar" bash scripts/gpu-kv-e2e.sh cpu
}

case "${1:-build}" in
build) build ;;
run) shift; run "$@" ;;
*) echo "usage: $0 build | run [sidecar bench gpu flags]" >&2; exit 2 ;;
esac
