#!/usr/bin/env bash
# Issue 12, memory side, against the binary: one-word messages (token
# counting), SIGTERM while counting, a 200 MB upstream reply (RSS), 2,000
# sessions under `ulimit -n 1024`. Usage:
#   scripts/bench-reliability.sh [path/to/sidecar]   (default: builds bin/sidecar)
# Needs python3 (the huge-reply upstream and the load client). Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-}
if [ -z "$BIN" ]; then
	make -s build >/dev/null
	BIN=bin/sidecar
fi
BIN=$(realpath "$BIN")
WORK=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2-$1:.3f}')"; }
hwm() { awk '/VmHWM/ {printf "%d MB", $2/1024}' "/proc/$1/status"; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$1/healthz" && return; sleep 0.1; done; }

# start_sidecar UPSTREAM_PORT [serve flags…]: sets SC (pid) and SP (port).
start_sidecar() {
	local up=$1; shift
	SP=$(port)
	mkdir -p "$WORK/data$SP"
	"$BIN" serve --listen "127.0.0.1:$SP" --upstream "http://127.0.0.1:$up" --data-dir "$WORK/data$SP" \
		--log-level warn --extract=false "$@" 2>"$WORK/log$SP" &
	SC=$!
	PIDS+=("$SC")
	wait_port "$SP"
}
stop() { kill -TERM "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# The scripted upstream of the binary itself, and a huge-reply one.
UP=$(port)
"$BIN" bench upstream --listen "127.0.0.1:$UP" >/dev/null 2>&1 &
PIDS+=($!)
BIG=$(port)
cat >"$WORK/bigup.py" <<'PY'
import http.server, json, sys
port, size = int(sys.argv[1]), int(sys.argv[2])
word = "a" * size
body = json.dumps({"id": "x", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop",
	"message": {"role": "assistant", "content": word}}]}).encode()
class H(http.server.BaseHTTPRequestHandler):
	protocol_version = "HTTP/1.1"
	def log_message(self, *a): pass
	def do_POST(self):
		req = self.rfile.read(int(self.headers.get("Content-Length", 0)))
		if b'"stream":true' in req or b'"stream": true' in req:
			self.send_response(200); self.send_header("Content-Type", "text/event-stream")
			self.send_header("Transfer-Encoding", "chunked"); self.end_headers()
			def chunk(b): self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))
			for i in range(0, size, 1 << 16):
				chunk(b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % word[i:i + (1 << 16)].encode())
			chunk(b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
			self.wfile.write(b"0\r\n\r\n")
			return
		self.send_response(200); self.send_header("Content-Type", "application/json")
		self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
PY
python3 "$WORK/bigup.py" "$BIG" 200000000 &
PIDS+=($!)
for _ in $(seq 100); do curl -s -o /dev/null -X POST -d '{}' "http://127.0.0.1:$BIG/" && break; sleep 0.2; done

cat >"$WORK/rec.py" <<'PY'
import json, sys
m = json.load(sys.stdin)["messages"]
kept = len(m[-1]["content"]) if len(m) > 1 else 0
print(f"{len(m)} messages, reply kept {kept} bytes, partial {m[-1].get('partial', False)}")
PY

chat() { # chat PORT SESSION BODYFILE → prints "code seconds"
	local t0 t1 code
	t0=$(now)
	code=$(curl -s -o "$WORK/resp" -w '%{http_code}' --max-time 600 -H 'Authorization: Bearer k' -H "X-Session-ID: $2" \
		"http://127.0.0.1:$1/v1/chat/completions" --data-binary @"$3" || echo 000)
	t1=$(now)
	echo "$code $(secs "$t0" "$t1")"
}
word_body() { python3 -c "import json; print(json.dumps({'model':'m','messages':[{'role':'user','content':'$2'*$1}]}))" >"$3"; }

echo "## one long word in a session request (row 1)"
start_sidecar "$UP" --window-tokens 100000000
for n in 100000 400000; do
	word_body $n a "$WORK/w$n.json"
	echo "a x $n: $(chat "$SP" "w$n" "$WORK/w$n.json") s"
done
python3 -c "import json; print(json.dumps({'model':'m','messages':[{'role':'user','content':'中文没有空格'*70000}]}))" >"$WORK/cjk.json"
echo "CJK x 420000 bytes: $(chat "$SP" cjk "$WORK/cjk.json") s, RSS peak $(hwm "$SC")"
stop "$SC"
start_sidecar "$UP"
word_body 33000000 a "$WORK/w33.json"
echo "a x 33,000,000, 8192-token window: $(chat "$SP" w33 "$WORK/w33.json") s, RSS peak $(hwm "$SC")"
stop "$SC"

echo "## SIGTERM while counting a 30 MB word (row 2; grace 5 s)"
start_sidecar "$UP" --window-tokens 100000000 --shutdown-timeout 5s
word_body 31457280 a "$WORK/w30.json"
chat "$SP" w30 "$WORK/w30.json" >"$WORK/w30.out" &
CL=$!
sleep 1.5
t0=$(now)
kill -TERM "$SC"
( sleep 60; kill -9 "$SC" 2>/dev/null && echo "still running 60 s after SIGTERM: killed" ) &
KILLER=$!
wait "$SC" || true
echo "exited $(secs "$t0" "$(now)") s after SIGTERM; the request got: $(wait $CL; cat "$WORK/w30.out")"
kill "$KILLER" 2>/dev/null || true

echo "## a 200 MB one-word upstream reply (row 3)"
for stream in false true; do
	start_sidecar "$BIG"
	echo "{\"model\":\"m\",\"stream\":$stream,\"messages\":[{\"role\":\"user\",\"content\":\"say a lot\"}]}" >"$WORK/big.json"
	r=$(chat "$SP" "big$stream" "$WORK/big.json")
	sleep 2
	rec=$(curl -s -H 'Authorization: Bearer k' "http://127.0.0.1:$SP/v1/sessions/big$stream" | python3 "$WORK/rec.py" || echo "no session")
	echo "stream=$stream: $r s, RSS peak $(hwm "$SC"), CPU $(ps -o times= -p "$SC" | tr -d ' ') s, recorded: $rec"
	t0=$(now)
	stop "$SC"
	echo "  exited $(secs "$t0" "$(now)") s after SIGTERM"
done

echo "## 2,000 sessions under ulimit -n 1024 (row 11)"
SP=$(port)
mkdir -p "$WORK/ul"
bash -c "ulimit -n 1024; exec '$BIN' serve --listen 127.0.0.1:$SP --upstream http://127.0.0.1:$UP --data-dir '$WORK/ul' --log-level warn --extract=false" 2>"$WORK/ul.log" &
SC=$!
PIDS+=("$SC")
wait_port "$SP"
python3 - "$SP" <<'PY'
import sys, json, urllib.request, concurrent.futures, collections, time
port = sys.argv[1]
def one(i):
	s, r = i % 2000, i // 2000
	req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
		data=json.dumps({"model": "m", "messages": [{"role": "user", "content": f"session {s} round {r}"}]}).encode(),
		headers={"Authorization": "Bearer k", "X-Session-ID": f"s{s}", "X-Session-Mode": "append"})
	try:
		with urllib.request.urlopen(req, timeout=60) as resp:
			resp.read(); return resp.status
	except urllib.error.HTTPError as e:
		return e.code
	except Exception:
		return "error"
t0 = time.time()
with concurrent.futures.ThreadPoolExecutor(32) as ex:
	codes = collections.Counter(ex.map(one, range(4000)))
print(f"4000 requests (2 per session, 32 in flight) in {time.time()-t0:.1f} s: {dict(codes)}")
m = urllib.request.urlopen(f"http://127.0.0.1:{int(port)+1000}/metrics").read().decode()  # the admin listener
for l in m.splitlines():
	if l.startswith(("sidecar_memory_bypassed_total", "sidecar_memory_turns_total", "sidecar_memory_open_files", "sidecar_memory_log_reopens_total")):
		print(l)
PY
echo "descriptors open: $(ls /proc/$SC/fd | wc -l); 'too many open files' logged: $(grep -c 'too many open files' "$WORK/ul.log" || true)"
stop "$SC"
