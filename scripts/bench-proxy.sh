#!/usr/bin/env bash
# Proxy overhead: one loopback mock upstream reached directly, through the
# sidecar and through nginx (proxy buffering off, keep-alive upstream), with
# the same bounded load. Prints added latency per path and sidecar/nginx
# ratios, allocations per proxied request and the sidecar's RSS before and
# after the run. Usage: scripts/bench-proxy.sh [--json] [extra bench flags]
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

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP=$(free_port); SC=$(free_port); NG=$(free_port)

bin/sidecar bench upstream --listen "127.0.0.1:$UP" 2>"$work/upstream.log" & pids+=($!)
${SIDECAR_ENV:-} bin/sidecar serve --listen "127.0.0.1:$SC" --upstream "http://127.0.0.1:$UP" \
  --data-dir "$work/data" --log-level warn ${SIDECAR_PPROF:+--pprof $SIDECAR_PPROF} 2>"$work/sidecar.log" & pids+=($!)

cat >"$work/nginx.conf" <<CONF
worker_processes 2;
pid $work/nginx.pid;
error_log $work/nginx-error.log warn;
daemon off;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $work/client_body;
  proxy_temp_path $work/proxy;
  fastcgi_temp_path $work/fastcgi;
  uwsgi_temp_path $work/uwsgi;
  scgi_temp_path $work/scgi;
  client_max_body_size 32m;
  upstream llm { server 127.0.0.1:$UP; keepalive 256; }
  server {
    listen 127.0.0.1:$NG;
    location / {
      proxy_pass http://llm;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 600s;
    }
  }
}
CONF
"$NGINX" -c "$work/nginx.conf" -p "$work" & pids+=($!)

for port in "$UP" "$SC" "$NG"; do
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
done

bin/sidecar bench proxy \
  --target "direct=127.0.0.1:$UP" \
  --target "sidecar=127.0.0.1:$SC,metrics" \
  --target "nginx=127.0.0.1:$NG" "$@"
