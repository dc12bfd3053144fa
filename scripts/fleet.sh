#!/usr/bin/env bash
# A fleet on one machine, for trying it out: redis-server (AOF, appendfsync
# always), two llama-servers and two sidecars in front of them sharing
# Redis. Any sidecar serves any session; kill one (or its engine) and the
# other carries on. Ctrl-C stops everything.
#
#   scripts/fleet.sh [MODEL.gguf]
#
# Environment: LLAMA_SERVER (default ../shared/llama/bin/llama-server),
# SIDECAR (default bin/sidecar, built if missing), FLEET_DIR (default
# ./fleet-data), REDIS_PORT (6390), LLAMA_PORTS ("8001 8002"),
# SIDECAR_PORTS ("8081 8082"). Without MODEL, the tiny random model of
# ../shared/llama/tiny_gguf.py is written (tests and demos only).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_SERVER=${LLAMA_SERVER:-../shared/llama/bin/llama-server}
SIDECAR=${SIDECAR:-bin/sidecar}
DIR=${FLEET_DIR:-./fleet-data}
REDIS_PORT=${REDIS_PORT:-6390}
read -r -a LLAMA_PORTS <<<"${LLAMA_PORTS:-8001 8002}"
read -r -a SIDECAR_PORTS <<<"${SIDECAR_PORTS:-8081 8082}"
MODEL=${1:-}

command -v redis-server >/dev/null || { echo "redis-server not found (apt-get install redis-server)" >&2; exit 1; }
[ -x "$LLAMA_SERVER" ] || { echo "llama-server not found at $LLAMA_SERVER (set LLAMA_SERVER)" >&2; exit 1; }
[ -x "$SIDECAR" ] || make build >/dev/null
mkdir -p "$DIR"
if [ -z "$MODEL" ]; then
  MODEL=$DIR/tiny.gguf
  [ -f "$MODEL" ] || python3 ../shared/llama/tiny_gguf.py "$MODEL" >/dev/null
fi

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

mkdir -p "$DIR/redis"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$DIR/redis" --appendonly yes \
  --appendfsync always --save '' --logfile "$DIR/redis/redis.log" &
pids+=($!)
until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.1; done

for i in 0 1; do
  d=$DIR/replica$i
  mkdir -p "$d/slots"
  "$LLAMA_SERVER" -m "$MODEL" --host 127.0.0.1 --port "${LLAMA_PORTS[$i]}" -np 2 -c 8192 \
    --slot-save-path "$d/slots" --cache-ram 8 --metrics >"$d/llama-server.log" 2>&1 &
  pids+=($!)
done
for i in 0 1; do
  until curl -sf "http://127.0.0.1:${LLAMA_PORTS[$i]}/health" >/dev/null; do sleep 0.2; done
done
for i in 0 1; do
  d=$DIR/replica$i
  "$SIDECAR" serve --listen "127.0.0.1:${SIDECAR_PORTS[$i]}" --upstream "http://127.0.0.1:${LLAMA_PORTS[$i]}" \
    --data-dir "$d/data" --engine llamacpp --llamacpp-slot-dir "$d/slots" --llamacpp-slots 2 \
    --remote "redis://127.0.0.1:$REDIS_PORT/0" --log-format text 2>>"$d/sidecar.log" &
  pids+=($!)
done
for i in 0 1; do
  until curl -sf "http://127.0.0.1:${SIDECAR_PORTS[$i]}/healthz" >/dev/null; do sleep 0.2; done
done
echo "fleet up: sidecars http://127.0.0.1:${SIDECAR_PORTS[0]} and http://127.0.0.1:${SIDECAR_PORTS[1]}, redis 127.0.0.1:$REDIS_PORT; logs in $DIR"
wait -n
