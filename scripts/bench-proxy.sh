#!/usr/bin/env bash
# Proxy overhead, side by side in one run: one loopback mock upstream
# (`sidecar bench upstream`) reached directly, through nginx (proxy
# buffering off, keep-alive upstream pool, $NGINX_WORKERS workers, default 1),
# through a sidecar on the stateless pass-through path (requests without an
# API key) and through a second sidecar on the session path (API key and
# session id, memory on, --fsync interval). `sidecar bench proxy` sends the
# same load to each path at 8 and 64 connections, non-streamed and streamed
# (time to first event and to the last), and reports added latency over
# direct, requests/s at that concurrency, CPU seconds per 10K requests of
# each process (from /proc/PID/stat utime+stime) and sidecar/nginx ratios.
# Usage: scripts/bench-proxy.sh [--json] [extra bench proxy flags]
# Environment: NGINX_WORKERS (1), UPSTREAM_ARGS (e.g. "--event-gap 2ms": streams paced as an
# engine generating tokens), SIDECAR_ENV (e.g. "GOGC=400 GOMAXPROCS=1"),
# SIDECAR_ARGS (extra serve flags for both sidecars), SIDECAR_PPROF (a
# loopback address for the pass-through sidecar's pprof).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  echo "bench-proxy: installing nginx (Debian package)" >&2
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq nginx >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq nginx >/dev/null; fi
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

mkdir -p bin
go build -o bin/sidecar ./cmd/sidecar
go build -o bin/sidecar-bench ./cmd/sidecar-bench # what `sidecar bench` runs

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP=$(free_port); SC=$(free_port); SS=$(free_port); NG=$(free_port)

# shellcheck disable=SC2086
bin/sidecar bench upstream --listen "127.0.0.1:$UP" ${UPSTREAM_ARGS:-} 2>"$work/upstream.log" & UPPID=$!; pids+=($UPPID)
# shellcheck disable=SC2086
env ${SIDECAR_ENV:-} bin/sidecar serve --listen "127.0.0.1:$SC" --upstream "http://127.0.0.1:$UP" \
  --data-dir "$work/data" --log-level warn ${SIDECAR_PPROF:+--pprof $SIDECAR_PPROF} ${SIDECAR_ARGS:-} \
  2>"$work/sidecar.log" & SCPID=$!; pids+=($SCPID)
# shellcheck disable=SC2086
env ${SIDECAR_ENV:-} bin/sidecar serve --listen "127.0.0.1:$SS" --upstream "http://127.0.0.1:$UP" \
  --data-dir "$work/data-session" --log-level warn --fsync interval ${SIDECAR_ARGS:-} \
  2>"$work/sidecar-session.log" & SSPID=$!; pids+=($SSPID)

# shellcheck source=scripts/nginx-conf.sh
. scripts/nginx-conf.sh
nginx_conf "$work" "$NG" "$UP"
# daemon off: $! is the master; its workers are its children, which the
# benchmark charges to nginx too.
"$NGINX" -c "$work/nginx.conf" -p "$work" 2>"$work/nginx.log" & NGPID=$!; pids+=($NGPID)

for port in "$UP" "$SC" "$SS" "$NG"; do
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
done

bin/sidecar bench proxy \
  --target "direct=127.0.0.1:$UP" \
  --target "nginx=127.0.0.1:$NG,pid=$NGPID" \
  --target "sidecar=127.0.0.1:$SC,metrics,pid=$SCPID" \
  --target "sidecar-session=127.0.0.1:$SS,metrics,session,pid=$SSPID" \
  --upstream-pid "$UPPID" "$@"
