#!/usr/bin/env bash
# Builds LMCache's own native RESP connector (the `resp` L2 adapter of its
# multiprocess mode: csrc/storage_backends/redis/ with ../connector_*.h)
# standalone, with test/resp/lmcache_native_driver.cpp, and runs it against
# the sidecar's --resp-listen and against a redis-server, side by side.
#
#   scripts/lmcache-native.sh LMCACHE_CSRC [WORKERS CHUNK_MIB CHUNKS]
#
# LMCACHE_CSRC is a folder holding LMCache's csrc/storage_backends (a
# checkout of github.com/LMCache/LMCache). Needs g++ (C++17), redis-server
# and bin/sidecar (make build). The connector needs no Python, torch or
# pybind11: ConnectorBase is plain C++ threads and an eventfd.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:?usage: scripts/lmcache-native.sh LMCACHE_CSRC [WORKERS CHUNK_MIB CHUNKS]}
workers=${2:-8} chunk=${3:-8} chunks=${4:-64}
out=out/lmcache-native
rm -rf "$out" && mkdir -p "$out"
cp -r "$src/csrc/storage_backends" "$out/"
sb=$out/storage_backends
# Versions of these files a commit apart disagree on the DELETE the newer
# connector_base.h and redis/connector.cpp use; add what is missing.
grep -q BATCH_TILE_DELETE "$sb/connector_types.h" ||
  sed -i 's/BATCH_TILE_EXISTS };/BATCH_TILE_EXISTS, BATCH_TILE_DELETE };/' "$sb/connector_types.h"
grep -q per_key_results "$sb/connector_types.h" ||
  sed -i 's/std::vector<uint8_t> exists_results;/std::vector<uint8_t> exists_results;\n  std::vector<uint8_t> per_key_results;/' "$sb/connector_types.h"
grep -q del_prefix "$sb/redis/connector.h" ||
  sed -i 's/  std::string exists_prefix;/  std::string exists_prefix;\n  std::string del_prefix = "*2\\r\\n$3\\r\\nDEL\\r\\n";/' "$sb/redis/connector.h"
grep -q do_single_delete "$sb/redis/connector.h" ||
  sed -i 's/  bool do_single_exists(WorkerConn& conn, const std::string& key) override;/&\n  bool do_single_delete(WorkerConn\& conn, const std::string\& key) override;/' "$sb/redis/connector.h"
g++ -std=c++17 -O2 -pthread -I"$sb/redis" -o "$out/driver" \
  test/resp/lmcache_native_driver.cpp "$sb/redis/connector.cpp"

port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
rport=$(port) sport=$(port) hport=$(port)
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --requirepass secret \
  --daemonize no --logfile "$out/redis.log" & rpid=$!
bin/sidecar serve --listen 127.0.0.1:"$hport" --upstream http://127.0.0.1:1 --data-dir "$out/data" \
  --resp-listen 127.0.0.1:"$sport" --kv-ram-bytes 2GiB --log-level warn 2>"$out/sidecar.log" & spid=$!
trap 'kill $rpid $spid 2>/dev/null' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$hport/healthz" >/dev/null && redis-cli -p "$rport" -a secret --no-auth-warning ping >/dev/null 2>&1 && break
  sleep 0.1
done
# AUTH default secret: redis-server's default user; the sidecar's tenant of
# the password alone.
for target in "redis-server $rport 0" "sidecar $sport 1"; do
  set -- $target
  echo "== $1 (LMCache RedisConnector, $workers workers, $chunks chunks of $chunk MiB)"
  TENANTS=$3 "$out/driver" 127.0.0.1 "$2" default secret "$workers" "$chunk" "$chunks"
  TENANTS=$3 "$out/driver" 127.0.0.1 "$2" default secret "$workers" "$chunk" "$chunks" user-a # a cache_salt
done
