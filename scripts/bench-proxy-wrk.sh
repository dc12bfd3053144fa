#!/usr/bin/env bash
# bench-proxy-wrk.sh: issue 25's own comparison, wrk -t1 -c$C -d${D}s --latency with a POST of a
# chat completion without an API key (the pass-through path) against the scripted upstream
# directly, through nginx (one worker, keep-alive pool, buffering off) and through the sidecar,
# alternated twice. Environment: C (8), D (8 s), TURNS (0: one short message; N: a chat history
# of N turns, ~0.7 KB each), SIDECAR_ENV (e.g. GOMAXPROCS=1), SIDECAR_ARGS (e.g.
# --event-loop=false), BIN, OLD (a second sidecar binary, e.g. one built from an earlier commit,
# measured in the same rounds as "sidecar-old"; OLD=$BIN with OLD_ARGS=--event-loop=false measures
# one binary both ways), OLD_ARGS (the second binary's arguments; default SIDECAR_ARGS), R (rounds, 2).
# Needs wrk and nginx (Debian packages).
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-bin/sidecar}; C=${C:-8}; D=${D:-8}; W=$(mktemp -d)
UP=19100; SC=19180; NG=19190
$BIN bench upstream --listen 127.0.0.1:$UP 2>/dev/null & P1=$!
env ${SIDECAR_ENV:-} $BIN serve --listen 127.0.0.1:$SC --upstream http://127.0.0.1:$UP --data-dir $W/d --log-level warn ${SIDECAR_ARGS:-} 2>/dev/null & P2=$!
TARGETS="direct:$UP nginx:$NG sidecar:$SC"; P4=""
if [ -n "${OLD:-}" ]; then
  env ${SIDECAR_ENV:-} $OLD serve --listen 127.0.0.1:19181 --upstream http://127.0.0.1:$UP --data-dir $W/d2 --log-level warn ${OLD_ARGS-${SIDECAR_ARGS:-}} 2>/dev/null & P4=$!
  TARGETS="$TARGETS sidecar_old:19181"
fi
# shellcheck source=scripts/nginx-conf.sh
. scripts/nginx-conf.sh
nginx_conf $W $NG $UP
nginx -c $W/nginx.conf -p $W 2>/dev/null & P3=$!
# TURNS=N sends a chat history of N user/assistant pairs (about 0.7 KB each, newlines in the
# replies) instead of the one short message: bodies as a chat client sends them.
python3 - "${TURNS:-0}" > $W/post.lua <<'PY'
import json, sys
turns = int(sys.argv[1])
msgs = [{"role": "user", "content": "Say something short."}]
if turns:
    msgs = [{"role": "system", "content": "You are a helpful assistant. " * 20}]
    for i in range(turns):
        msgs.append({"role": "user", "content": ("Tell me about item %d in detail please. " % i) * 8})
        msgs.append({"role": "assistant", "content": ("Item %d is a thing with properties.\n " % i) * 8})
body = json.dumps({"model": "m", "messages": msgs})
print('wrk.method = "POST"\nwrk.body = [=[%s]=]\nwrk.headers["Content-Type"] = "application/json"' % body)
PY
echo "body: $(($(wc -c < $W/post.lua) - 90)) bytes"
sleep 1
# us converts wrk's latency (e.g. 182.00us, 2.84ms, 1.01s) to microseconds.
us() { awk -v v="$1" 'BEGIN{n=v+0; if (v ~ /us$/) print n; else if (v ~ /ms$/) print n*1000; else if (v ~ /s$/) print n*1000000; else print n}'; }
for round in $(seq 1 "${R:-2}"); do for t in $TARGETS; do
  n=${t%%:*}; p=${t##*:}
  wrk -t1 -c$C -d${D}s --latency -s $W/post.lua http://127.0.0.1:$p/v1/chat/completions > $W/out 2>&1
  p50=$(awk '$1=="50%"{print $2}' $W/out); p99=$(awk '$1=="99%"{print $2}' $W/out); rps=$(awk '/Requests\/sec/{print $2}' $W/out); non2=$(awk '/Non-2xx/{print $4}' $W/out)
  echo "round $round $n p50=$p50 p99=$p99 rps=$rps non2xx=${non2:-0}"
  eval "${n}_p50=$(us "$p50") ${n}_p99=$(us "$p99") ${n}_rps=${rps:-0}"
done
  # shellcheck disable=SC2154 # set by the eval above
  awk -v d="$direct_p50" -v n50="$nginx_p50" -v s50="$sidecar_p50" -v n99="$nginx_p99" -v s99="$sidecar_p99" -v nr="$nginx_rps" -v sr="$sidecar_rps" -v r="$round" \
    'BEGIN{printf "round %s sidecar/nginx: added p50 %.2f, p99 %.2f, req/s %.2f\n", r, (n50>d ? (s50-d)/(n50-d) : 0), (n99>0 ? s99/n99 : 0), (nr>0 ? sr/nr : 0)}'
  if [ -n "$P4" ]; then
    # shellcheck disable=SC2154 # set by the eval above
    awk -v d="$direct_p50" -v n50="$nginx_p50" -v s50="$sidecar_old_p50" -v n99="$nginx_p99" -v s99="$sidecar_old_p99" -v nr="$nginx_rps" -v sr="$sidecar_old_rps" -v r="$round" \
      'BEGIN{printf "round %s sidecar-old/nginx: added p50 %.2f, p99 %.2f, req/s %.2f\n", r, (n50>d ? (s50-d)/(n50-d) : 0), (n99>0 ? s99/n99 : 0), (nr>0 ? sr/nr : 0)}'
  fi
done
kill $P1 $P2 $P3 $P4; wait 2>/dev/null; rm -rf $W
