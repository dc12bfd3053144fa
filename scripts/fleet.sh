#!/usr/bin/env bash
# A fleet on one machine, for trying it out: redis-server (AOF, appendfsync
# always), two llama-servers and two sidecars in front of them sharing
# Redis. Any sidecar serves any session; kill one (or its engine) and the
# other carries on. Ctrl-C stops everything.
#
#   scripts/fleet.sh [MODEL.gguf]
#
# Environment: LLAMA_SERVER (default ../shared/llama/bin/llama-server, else
# llama-server on PATH), SIDECAR (default bin/sidecar, built if missing),
# FLEET_DIR (default ./fleet-data), REDIS_PORT (6390), LLAMA_PORTS
# ("8001 8002"), SIDECAR_PORTS ("8081 8082"), ADMIN_PORTS (the sidecars'
# admin listeners: /metrics, the console; "9081 9082"), START_TIMEOUT (60 seconds for
# each process). Without MODEL, the tiny random model of tiny_gguf.py (beside
# llama-server's bin folder, or LLAMA_TINY_GGUF) is written (tests and demos
# only) and the
# llama-servers constrain its output to lowercase words (--grammar): its
# random weights otherwise emit bytes that are not UTF-8, which llama-server
# refuses with a 500.
#
# Every port must be free: a port another process holds is an error naming
# it, before anything starts. A process that exits or does not answer
# within START_TIMEOUT is an error with the end of its log.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_SERVER=${LLAMA_SERVER:-../shared/llama/bin/llama-server}
if [ ! -x "$LLAMA_SERVER" ] && command -v llama-server >/dev/null; then
  LLAMA_SERVER=$(command -v llama-server)
fi
SIDECAR=${SIDECAR:-bin/sidecar}
DIR=${FLEET_DIR:-./fleet-data}
REDIS_PORT=${REDIS_PORT:-6390}
read -r -a LLAMA_PORTS <<<"${LLAMA_PORTS:-8001 8002}"
read -r -a SIDECAR_PORTS <<<"${SIDECAR_PORTS:-8081 8082}"
read -r -a ADMIN_PORTS <<<"${ADMIN_PORTS:-$((SIDECAR_PORTS[0] + 1000)) $((SIDECAR_PORTS[1] + 1000))}"
START_TIMEOUT=${START_TIMEOUT:-60}
MODEL=${1:-}

fail() { echo "fleet: $*" >&2; exit 1; }

command -v redis-server >/dev/null || fail "redis-server not found (apt-get install redis-server)"
command -v redis-cli >/dev/null || fail "redis-cli not found (apt-get install redis-tools)"
command -v curl >/dev/null || fail "curl not found (apt-get install curl)"
[ -x "$LLAMA_SERVER" ] || fail "llama-server not found at $LLAMA_SERVER nor on PATH (set LLAMA_SERVER)"
[ "${#LLAMA_PORTS[@]}" -eq 2 ] && [ "${#SIDECAR_PORTS[@]}" -eq 2 ] && [ "${#ADMIN_PORTS[@]}" -eq 2 ] ||
  fail "LLAMA_PORTS, SIDECAR_PORTS and ADMIN_PORTS take two ports each"

# A port something already answers on would make a wait below succeed
# against the wrong process: refuse it first.
for p in "$REDIS_PORT" "${LLAMA_PORTS[@]}" "${SIDECAR_PORTS[@]}" "${ADMIN_PORTS[@]}"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    fail "port $p on 127.0.0.1 is taken by another process; stop it, or choose other ports (REDIS_PORT, LLAMA_PORTS, SIDECAR_PORTS, ADMIN_PORTS)"
  fi
done

[ -x "$SIDECAR" ] || make build >/dev/null
# Absolute: redis-server changes into --dir before it opens --logfile.
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
GRAMMAR=()
if [ -z "$MODEL" ]; then
  MODEL=$DIR/tiny.gguf
  TINY_GGUF=${LLAMA_TINY_GGUF:-$(dirname "$LLAMA_SERVER")/../tiny_gguf.py}
  [ -f "$MODEL" ] || python3 "$TINY_GGUF" "$MODEL" >/dev/null || fail "could not write the tiny model with $TINY_GGUF (needs python3; set LLAMA_TINY_GGUF); or give MODEL.gguf"
  GRAMMAR=(--grammar 'root ::= [a-z ]+')
fi

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_for NAME PID LOG CMD...: until CMD succeeds; fails when PID exits or
# START_TIMEOUT passes, showing the end of LOG.
wait_for() {
  local name=$1 pid=$2 log=$3 deadline=$((SECONDS + START_TIMEOUT))
  shift 3
  until "$@" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$log" >&2 || true
      fail "$name exited before it answered (log: $log)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 20 "$log" >&2 || true
      fail "$name did not answer within ${START_TIMEOUT}s (log: $log)"
    fi
    sleep 0.2
  done
}

mkdir -p "$DIR/redis"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$DIR/redis" --appendonly yes \
  --appendfsync always --save '' --logfile "$DIR/redis/redis.log" &
pids+=($!)
wait_for redis-server "$!" "$DIR/redis/redis.log" redis-cli -p "$REDIS_PORT" ping

llama=()
for i in 0 1; do
  d=$DIR/replica$i
  mkdir -p "$d/slots"
  "$LLAMA_SERVER" -m "$MODEL" --host 127.0.0.1 --port "${LLAMA_PORTS[$i]}" -np 2 -c 8192 \
    --slot-save-path "$d/slots" --cache-ram 8 --metrics "${GRAMMAR[@]}" >"$d/llama-server.log" 2>&1 &
  pids+=($!)
  llama+=($!)
done
for i in 0 1; do
  wait_for "llama-server $i" "${llama[$i]}" "$DIR/replica$i/llama-server.log" curl -sf "http://127.0.0.1:${LLAMA_PORTS[$i]}/health"
done
sidecars=()
for i in 0 1; do
  d=$DIR/replica$i
  "$SIDECAR" serve --listen "127.0.0.1:${SIDECAR_PORTS[$i]}" --admin-listen "127.0.0.1:${ADMIN_PORTS[$i]}" --upstream "http://127.0.0.1:${LLAMA_PORTS[$i]}" \
    --data-dir "$d/data" --engine llamacpp --llamacpp-slot-dir "$d/slots" --llamacpp-slots 2 \
    --remote "redis://127.0.0.1:$REDIS_PORT/0" --log-format text 2>>"$d/sidecar.log" &
  pids+=($!)
  sidecars+=($!)
done
for i in 0 1; do
  wait_for "sidecar $i" "${sidecars[$i]}" "$DIR/replica$i/sidecar.log" curl -sf "http://127.0.0.1:${SIDECAR_PORTS[$i]}/readyz"
done
echo "fleet up: sidecars http://127.0.0.1:${SIDECAR_PORTS[0]} and http://127.0.0.1:${SIDECAR_PORTS[1]} (metrics on http://127.0.0.1:${ADMIN_PORTS[0]}/metrics and :${ADMIN_PORTS[1]}), redis 127.0.0.1:$REDIS_PORT; logs in $DIR"
set +e
wait -n
status=$?
echo "fleet: a process exited ($status); stopping the others (logs in $DIR)" >&2
exit 1
