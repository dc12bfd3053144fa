#!/usr/bin/env bash
# walk.sh: issue 37's walk of one chat request, over what the request
# executed. Runs proxy's TestWalkOneChatTurn alone (a session's two
# streamed turns with memory on, before a scripted upstream) with coverage
# of the whole module into out/walk.cover, then bench/walk with that
# profile from (*proxy.Server).forward and from (*proxy.Server).handle,
# the fasthttp handler proxy/server.go serves with: each with -cover (calls
# into functions that ran) and with -cover -sites (from call sites that
# ran as well). Prints stops, files, returns to a file left, file entries,
# climbs back up, the most entered files, the climbs and the file pairs
# the walk crosses most (method: bench/walk/main.go).
#
# Usage: scripts/walk.sh [TREE]. TREE (default this checkout) is the
# checkout measured, e.g. a worktree of an older commit with
# proxy/walk_test.go copied in; the walker and out/ are this checkout's.
# GO (default go) may be set.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
here=$PWD
tree=$(cd "${1:-.}" && pwd)
mkdir -p out
prof=$here/out/walk.cover

# The event loop off: a session's chat request is served by the fasthttp
# handler either way; the profile then holds no loop.
(cd "$tree" && env -u SIDECAR_TEST_EVENT_LOOP "$GO" test -count=1 -covermode=set \
	-coverpkg=github.com/kvsidecar/kvsidecar/... -coverprofile="$prof" -run '^TestWalkOneChatTurn$' ./proxy)
(cd bench/walk && "$GO" build -o "$here/out/walk" .)
echo "tree: $tree ($(git -C "$tree" rev-parse --short HEAD))"
for entry in forward handle; do
	for sites in false true; do
		echo
		out/walk -dir "$tree" -entry "(*github.com/kvsidecar/kvsidecar/proxy.Server).$entry" -cover "$prof" -sites="$sites" -pairs 10
	done
done
