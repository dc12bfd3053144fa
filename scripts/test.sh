#!/usr/bin/env bash
# test.sh: make test. go vet, then every test with the race detector, in
# groups that run at the same time, since most of the long tests wait (on a
# real llama-server, a kill -9 and its restart, clients' pauses) more than
# they compute:
#
#   sidecar     go test -race ./cmd/sidecar, the binary end to end (its
#               real-engine tests run beside each other: t.Parallel,
#               -parallel 2); the longest group, started first
#   packages    go test -race on every other package
#   proxy-loop  ./proxy again with the event loop on (the binary's default),
#               then with frontdoor and internal/rawconn as shipped, without
#               the race detector (its build makes
#               the raw socket calls syscall's: internal/rawconn/sys_race_linux.go)
#   modules     bench/simulator (without the race detector: see modules()) and
#               bench/ceiling, modules of their own (bench/redisclients,
#               bench/respparser and bench/walk have no tests: make lint vets
#               them; redisclients' vet alone cost 65 s of CPU on a cold
#               build cache)
#
# Each group's output is shown when it ends, with its time; the script fails
# when any group failed. Logs stay in out/test-*.log. GO (default go) and
# TEST_TIMEOUT (default 20m, per go test) may be set.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
TIMEOUT=${TEST_TIMEOUT:-20m}
mkdir -p out

t0=$SECONDS
# go vet with -race compiles every package and its tests' dependencies as
# the race detector's build does, so the test groups below find them in the
# cache: without it each would compile them again (a non-race vet build
# first, then go commands running at once each compiling what the cache
# lacks). On a cold cache this is most of the compile work of make test.
echo "== go vet -race"
$GO vet -race ./... || exit 1

group() { # NAME COMMAND...: runs COMMAND in the background, logging to out/test-NAME.log
	local name=$1
	shift
	(
		local t=$SECONDS
		if "$@" >"out/test-$name.log" 2>&1; then
			cat "out/test-$name.log"
			echo "== $name: ok ($((SECONDS - t)) s)"
		else
			cat "out/test-$name.log"
			echo "== $name: FAIL ($((SECONDS - t)) s; log in out/test-$name.log)"
			exit 1
		fi
	) &
	pids+=($!)
}

proxy_loop() {
	SIDECAR_TEST_EVENT_LOOP=1 $GO test -race -count=1 -timeout "$TIMEOUT" ./proxy/ &&
		SIDECAR_TEST_EVENT_LOOP=1 $GO test -count=1 -timeout "$TIMEOUT" ./proxy/ ./frontdoor/ ./internal/rawconn/
}

# bench/simulator's tests replay traces on one goroutine (the simulator
# starts none, nor does otter without expiration): the race detector finds
# nothing there and multiplies their CPU by six (66 s against 10 s, measured
# with /usr/bin/time); the policies they replay are the tiers package's,
# race-tested with the other packages.
modules() {
	(cd bench/simulator && $GO vet ./... && $GO test -count=1 -timeout "$TIMEOUT" ./...) &&
		(cd bench/ceiling && $GO vet -race ./... && $GO test -race -count=1 -timeout "$TIMEOUT" ./...)
}

pids=()
others=$($GO list ./... | grep -v '/cmd/sidecar$') || exit 1
echo "== go test -race: sidecar, packages, proxy-loop and modules at once"
group sidecar $GO test -race -count=1 -timeout "$TIMEOUT" -parallel 2 ./cmd/sidecar/
# shellcheck disable=SC2086 # one argument per package
group packages $GO test -race -count=1 -timeout "$TIMEOUT" $others
group proxy-loop proxy_loop
group modules modules
failed=0
for p in "${pids[@]}"; do
	wait "$p" || failed=1
done
if [ "$failed" -ne 0 ]; then
	echo "== make test: FAIL after $((SECONDS - t0)) s"
	exit 1
fi
echo "== make test: ok in $((SECONDS - t0)) s"
