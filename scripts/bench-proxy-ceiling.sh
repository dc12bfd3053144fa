#!/usr/bin/env bash
# bench-proxy-ceiling.sh: where the sidecar's pass-through stands between nginx and the
# cheapest Go proxies. wrk -t1 -c$C -d${D}s POSTs a short chat completion (the pass-through
# path, no API key) through each proxy in turn, all in front of one scripted upstream, R
# rounds alternated; for each it prints requests/s, p50, p99 and the proxy's CPU per request
# (perf stat task-clock, and user/system from /proc over the same seconds), then each one's
# ratios to nginx. The yardsticks (bench/ceiling, built here):
#   evloop    one locked thread on its own edge-triggered epoll loop (nginx's design in Go)
#   evwork    evloop doing the sidecar's per-request work with the sidecar's code (-work: the
#             body's check, the generic engine hooks, the metrics; bench/ceiling/evloop/work.go)
#   netproxy  a goroutine per connection on net.Conn and bufio (Go's poller, nothing else)
#   fhproxy   a bare fasthttp server calling fasthttp.HostClient (fasthttp's reverse proxy)
# Each runs with GOMAXPROCS=1 (nginx runs one worker); the sidecar as shipped (the pass-through
# on the front door's event loop, frontdoor/loop_linux.go) and with --event-loop=false (on Go's poller). Environment: C (8), D (6 s), R (2), BIN,
# OLD (a second sidecar binary, e.g. built from an earlier commit, measured as sidecarOld), ONLY (the
# targets run beside nginx, e.g. "sidecar sidecarGo sidecarOld"; default all). Needs wrk, nginx
# and perf (Debian packages: wrk, nginx, linux-perf).
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-bin/sidecar}; C=${C:-8}; D=${D:-6}; R=${R:-2}; W=$(mktemp -d)
UP=19300; NG=19390
(cd bench/ceiling && for p in evloop netproxy fhproxy; do CGO_ENABLED=0 go build -o "$W/$p" ./$p || exit 1; done) || { echo "building bench/ceiling failed"; exit 1; }
$BIN bench upstream --listen 127.0.0.1:$UP 2>/dev/null & PIDS="$!"
# shellcheck source=scripts/nginx-conf.sh
. scripts/nginx-conf.sh
nginx_conf $W $NG $UP
nginx -c $W/nginx.conf -p $W 2>/dev/null & NGP=$!; PIDS="$PIDS $NGP"
start() { # name port command...
  local n=$1 p=$2; shift 2
  case " ${ONLY:-$n} " in *" $n "*) ;; *) return ;; esac
  env "$@" >/dev/null 2>&1 & PIDS="$PIDS $!"; TARGETS="$TARGETS $n:$p:$!"
}
TARGETS=""
start sidecar 19380 $BIN serve --listen 127.0.0.1:19380 --upstream http://127.0.0.1:$UP --data-dir $W/d1 --log-level warn
start sidecarGo 19381 $BIN serve --listen 127.0.0.1:19381 --upstream http://127.0.0.1:$UP --data-dir $W/d2 --log-level warn --event-loop=false
start evloop 19382 GOMAXPROCS=1 $W/evloop -listen 127.0.0.1:19382 -upstream 127.0.0.1:$UP
start evwork 19385 GOMAXPROCS=1 $W/evloop -listen 127.0.0.1:19385 -upstream 127.0.0.1:$UP -work
start netproxy 19383 GOMAXPROCS=1 $W/netproxy -listen 127.0.0.1:19383 -upstream 127.0.0.1:$UP
start fhproxy 19384 GOMAXPROCS=1 $W/fhproxy -listen 127.0.0.1:19384 -upstream 127.0.0.1:$UP
if [ -n "${OLD:-}" ]; then
  start sidecarOld 19386 $OLD serve --listen 127.0.0.1:19386 --upstream http://127.0.0.1:$UP --data-dir $W/d3 --log-level warn
fi
cat > $W/post.lua <<'LUA'
wrk.method = "POST"
wrk.body = '{"model":"m","messages":[{"role":"user","content":"Say something short."}]}'
wrk.headers["Content-Type"] = "application/json"
LUA
sleep 1.5
NGW=$(pgrep -P $NGP | head -1)
us() { awk -v v="$1" 'BEGIN{n=v+0; if (v ~ /us$/) print n; else if (v ~ /ms$/) print n*1000; else if (v ~ /s$/) print n*1000000; else print n}'; }
HZ=$(getconf CLK_TCK); M=$((D-2))
for round in $(seq "$R"); do
  for t in nginx:$NG:$NGW $TARGETS; do
    IFS=: read -r n p pid <<< "$t"
    wrk -t1 -c"$C" -d"${D}"s --latency -s $W/post.lua http://127.0.0.1:$p/v1/chat/completions > $W/out 2>&1 & WP=$!
    sleep 1
    read -r u0 s0 < <(awk '{print $14, $15}' /proc/$pid/stat)
    perf stat -e task-clock -p "$pid" -o $W/st -- sleep $M >/dev/null 2>&1
    read -r u1 s1 < <(awk '{print $14, $15}' /proc/$pid/stat)
    wait $WP
    rps=$(awk '/Requests\/sec/{print $2}' $W/out); p50=$(awk '$1=="50%"{print $2}' $W/out); p99=$(awk '$1=="99%"{print $2}' $W/out)
    non2=$(awk '/Non-2xx/{print $4}' $W/out); errs=$(awk '/Socket errors/{print}' $W/out)
    cpu=$(awk -v rps="$rps" -v m=$M '/task-clock/{gsub(",","",$1); printf "%.1f", $1*1000/(rps*m)}' $W/st)
    usr=$(awk -v a="$u0" -v b="$u1" -v hz="$HZ" -v rps="$rps" -v m=$M 'BEGIN{printf "%.1f", (b-a)/hz*1e6/(rps*m)}')
    sys=$(awk -v a="$s0" -v b="$s1" -v hz="$HZ" -v rps="$rps" -v m=$M 'BEGIN{printf "%.1f", (b-a)/hz*1e6/(rps*m)}')
    printf "round %s %-9s req/s %7.0f p50 %-9s p99 %-9s CPU/req %5s us (user %s, system %s)%s%s\n" \
      "$round" "$n" "$rps" "$p50" "$p99" "$cpu" "$usr" "$sys" "${non2:+ non-2xx $non2}" "${errs:+ $errs}"
    eval "${n}_rps=$rps ${n}_p99=$(us "$p99") ${n}_cpu=$cpu"
  done
  for t in $TARGETS; do
    n=${t%%:*}
    eval "awk -v n=$n -v r=\$${n}_rps -v nr=\$nginx_rps -v q=\$${n}_p99 -v nq=\$nginx_p99 -v c=\$${n}_cpu -v nc=\$nginx_cpu" \
      "'BEGIN{printf \"round %s %-9s / nginx: req/s %.2f, p99 %.2f, CPU/req %.2f\n\", $round, n, r/nr, q/nq, c/nc}'"
  done
done
kill $PIDS 2>/dev/null; wait 2>/dev/null; rm -rf $W
