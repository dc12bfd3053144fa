#!/usr/bin/env bash
# llama-suite.sh: llama.cpp's own server test suite (tools/server/tests at
# the commit ../shared/llama's llama-server was built from), run against the
# real llama-server direct, then with the sidecar in front of it (each
# --engine in ENGINES), every preset's model swapped for the tiny one that
# ../shared/llama/tiny_gguf.py writes, pytest's default -m "not slow".
# Prints each run's counts and every test that passes direct but not
# through the sidecar (the never-worse check); exits 1 when there is one.
#
#   LLAMA_CPP_SRC=/path/to/llama.cpp scripts/llama-suite.sh
#
# LLAMA_CPP_SRC is a llama.cpp checkout or git directory holding
# LLAMA_CPP_COMMIT (default 3f545becc; the search tool's fetch of
# ngxson/llama.cpp mirrors it). Needs Debian's python3-pytest,
# python3-requests, python3-wget, python3-aiohttp, python3-numpy and
# python3-prometheus-client (the suite's own requirements.txt; openai has no
# Debian package, so the tests that import it fail both ways), and setpriv
# (util-linux). ENGINES defaults to "generic llamacpp"; PYTEST_K selects
# tests (pytest -k, e.g. "tokenize or basic"). Results land in $OUT (default
# out/llama-suite).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${LLAMA_CPP_SRC:?set LLAMA_CPP_SRC to a llama.cpp checkout or git directory}
COMMIT=${LLAMA_CPP_COMMIT:-3f545becc}
ENGINES=${ENGINES:-generic llamacpp}
OUT=${OUT:-out/llama-suite}
LLAMA_SERVER=${LLAMA_SERVER:-$(cd ../shared/llama/bin 2>/dev/null && pwd)/llama-server}
PY=${PYTHON:-/usr/bin/python3}
[ -x "$LLAMA_SERVER" ] || { echo "no llama-server at $LLAMA_SERVER (set LLAMA_SERVER)" >&2; exit 2; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# The suite at the server's commit.
# (checked out file by file: a snapshot may lack the repository's large
# blobs, which git archive trips on)
gitdir=""
if git --git-dir="$SRC" rev-parse -q --verify "$COMMIT^{commit}" >/dev/null 2>&1; then
  gitdir=$SRC
elif git -C "$SRC" rev-parse -q --verify "$COMMIT^{commit}" >/dev/null 2>&1; then
  gitdir=$(git -C "$SRC" rev-parse --absolute-git-dir)
fi
if [ -n "$gitdir" ]; then
  git --git-dir="$gitdir" ls-tree -r --name-only "$COMMIT" tools/server/tests | while read -r f; do
    mkdir -p "$WORK/$(dirname "$f")"
    git --git-dir="$gitdir" cat-file blob "$COMMIT:$f" >"$WORK/$f"
  done
else
  mkdir -p "$WORK/tools/server" && cp -r "$SRC/tools/server/tests" "$WORK/tools/server/"
fi
TESTS=$WORK/tools/server/tests
python3 ../shared/llama/tiny_gguf.py "$WORK/tiny.gguf" >/dev/null

# Every preset's model becomes the tiny one; nothing is downloaded.
cat >>"$TESTS/utils.py" <<'PY'

# --- kvsidecar: every preset on the tiny model, offline -------------------
_kvs_start = ServerProcess.start
def _kvs_tiny_start(self, *a, **k):
    tiny = os.environ["KVSIDECAR_TINY_MODEL"]
    self.model_file, self.model_hf_repo, self.model_hf_file, self.model_url = tiny, None, None, None
    if self.model_draft:
        self.model_draft = tiny
    self.mmproj_url = None
    self.offline = True
    return _kvs_start(self, *a, **k)
ServerProcess.start = _kvs_tiny_start
ServerPreset.load_all = staticmethod(lambda: None)
PY

make -s build >/dev/null
SIDECAR=$(pwd)/bin/sidecar

# The "server" the suite starts through the sidecar: llama-server on a port
# of its own, the sidecar on the port the test asked for; when either ends
# the other is stopped and the wrapper exits (a llama-server that cannot
# start fails the test at once, as direct); the suite's terminate reaches
# both, and a kill of the wrapper takes them along (pdeathsig).
cat >"$WORK/through.sh" <<'SH'
#!/usr/bin/env bash
args=(); host=127.0.0.1; port=8080; slots=""
while [ $# -gt 0 ]; do
  case "$1" in
    --host) host=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --slot-save-path) slots=$2; args+=("$1" "$2"); shift 2 ;;
    -np|--parallel) np=$2; args+=("$1" "$2"); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
up=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
setpriv --pdeathsig KILL "$KVS_LLAMA_SERVER" "${args[@]}" --host 127.0.0.1 --port "$up" & L=$!
data=$(mktemp -d)
setpriv --pdeathsig KILL "$KVS_SIDECAR" serve --listen "$host:$port" --upstream "http://127.0.0.1:$up" --data-dir "$data" \
  --engine "$KVS_ENGINE" --llamacpp-slot-dir "${slots:-$data}" --llamacpp-slots "${np:-1}" \
  --admin-listen off --shutdown-timeout 2s --log-level warn --log-format text & S=$!
trap 'kill -TERM $S $L 2>/dev/null; wait; rm -rf "$data"; exit 143' TERM INT
wait -n $L $S; code=$?
kill -TERM $S $L 2>/dev/null; wait
rm -rf "$data"
exit $code
SH
chmod +x "$WORK/through.sh"

run() { # run NAME SERVER_BINARY [ENV…]
  local name=$1 bin=$2; shift 2
  echo "== $name" >&2
  (cd "$TESTS" && env "$@" LLAMA_SERVER_BIN_PATH="$bin" KVSIDECAR_TINY_MODEL="$WORK/tiny.gguf" \
    KVS_LLAMA_SERVER="$LLAMA_SERVER" KVS_SIDECAR="$SIDECAR" \
    timeout 3600 "$PY" -m pytest -q -p no:cacheprovider --continue-on-collection-errors -m "not slow" -rA ${PYTEST_K:+-k "$PYTEST_K"} unit \
    >"$OUT/$name.log" 2>&1) || true
  # -a: the tiny model's answers put bytes in the log that are not text;
  # without it grep calls the whole log binary and lists nothing.
  grep -aE '^(PASSED|FAILED|ERROR) ' "$OUT/$name.log" | sed -E 's/ - .*//' | sort -u >"$OUT/$name.results"
  echo "$name: $(grep -c '^PASSED' "$OUT/$name.results" || true) passed, $(grep -cE '^(FAILED|ERROR)' "$OUT/$name.results" || true) failed" >&2
}

run direct "$LLAMA_SERVER"
if ! grep -q '^PASSED' "$OUT/direct.results"; then
  # Nothing passed direct: "every test that passes direct passes through"
  # would hold of anything.
  echo "direct: no test passed (see $OUT/direct.log); nothing to compare" >&2
  exit 1
fi
status=0
for e in $ENGINES; do
  run "through-$e" "$WORK/through.sh" KVS_ENGINE="$e"
  worse=$(comm -23 <(grep '^PASSED' "$OUT/direct.results" | cut -d' ' -f2) <(grep '^PASSED' "$OUT/through-$e.results" | cut -d' ' -f2))
  if [ -n "$worse" ]; then
    status=1
    echo "passes direct, not through the sidecar (--engine $e):" >&2
    echo "$worse" | sed 's/^/  /' >&2
  else
    echo "through-$e: every test that passes direct passes" >&2
  fi
done
exit $status
