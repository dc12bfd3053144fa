#!/usr/bin/env bash
# gpu-kv-e2e.sh DEVICE: the KV API through the sidecar binary with its Focus tier on DEVICE
# (cuda or cpu): PUT 16 tensors of 48 MiB, GET them back byte-compared, the tier each came
# from, kill -9, restart, GET again. Run by `scripts/gpu-test.sh run` (SC: the sidecar binary).
set -u
DEV=${1:-cuda}; S=${SC:-./out/sidecar}; D=$(mktemp -d)
$S bench upstream --listen 127.0.0.1:18000 2>/dev/null & UP=$!
start() { $S serve --listen 127.0.0.1:18080 --upstream http://127.0.0.1:18000 --data-dir $D/data --device $DEV --log-level info 2>>$D/sc.log & SCP=$!
  for i in $(seq 100); do curl -sf -m1 http://127.0.0.1:18080/readyz >/dev/null && return; sleep 0.1; done; echo "not ready"; }
start
grep -E "opened device|gpu:" $D/sc.log | head -3
H=(-H 'Authorization: Bearer sk-gpu-e2e' -H 'Content-Type: application/octet-stream')
for i in $(seq 1 16); do head -c $((48<<20)) /dev/urandom > $D/t$i; done
t0=$(date +%s%N)
for i in $(seq 1 16); do curl -s -o /dev/null -w "%{http_code} " -X PUT "${H[@]}" -H 'X-KV-Dtype: f16' -H "X-KV-Shape: 24,1048576" --data-binary @$D/t$i http://127.0.0.1:18080/v1/kv/e2e/k$i; done; echo
t1=$(date +%s%N)
ok=0; for i in $(seq 1 16); do curl -s -D $D/h$i -o $D/g$i "${H[@]}" http://127.0.0.1:18080/v1/kv/e2e/k$i; cmp -s $D/t$i $D/g$i && ok=$((ok+1)); done
t2=$(date +%s%N)
echo "put 16x48MiB $(( (t1-t0)/1000000 )) ms, get $(( (t2-t1)/1000000 )) ms, identical $ok/16; tiers: $(grep -hi x-kv-tier $D/h* | sort | uniq -c | tr -s ' \r\n' ' ')"
curl -s http://127.0.0.1:19080/metrics | grep -E "^sidecar_(kv_tier_bytes|kv_tier_blocks|kv_hits|device)" | head -12
kill -9 $SCP; wait $SCP 2>/dev/null; start
ok=0; for i in $(seq 1 16); do curl -s -D $D/h$i -o $D/g$i "${H[@]}" http://127.0.0.1:18080/v1/kv/e2e/k$i; cmp -s $D/t$i $D/g$i && ok=$((ok+1)); done
echo "after kill -9 and restart: identical $ok/16; tiers: $(grep -hi x-kv-tier $D/h* | sort | uniq -c | tr -s ' \r\n' ' ')"
kill $SCP $UP; wait 2>/dev/null; rm -rf $D
