# kvsidecar — run `make help` for the targets.
GO       ?= go
BIN      ?= bin/sidecar
BENCHBIN ?= $(dir $(BIN))sidecar-bench
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS  := -s -w -X main.version=$(VERSION)
PKGS     := ./...
FUZZTIME ?= 30s
LOCOMO   ?= ../shared/data/locomo-dev.json
HOSTILE_DURATION ?= 60s
PROMTOOL ?= promtool

export SIDECAR_UPSTREAM ?= http://127.0.0.1:8000
export SIDECAR_LISTEN   ?= 127.0.0.1:8080
export SIDECAR_DATA_DIR ?= ./data

.PHONY: help build run test test-race test-hostile test-differential test-llama-suite test-mcp bench-mcp bench bench-resp bench-proxy bench-proxy-wrk bench-proxy-ceiling bench-kv bench-policy bench-recall bench-archive bench-preload bench-memory bench-memory-e2e bench-reliability bench-amortization bench-sessions bench-fleet bench-scale fleet docker-cuda fuzz lint check-deploy clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

build: ## build bin/sidecar and, beside it, bin/sidecar-bench (what `sidecar bench` runs); static, no cgo
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/sidecar
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BENCHBIN) ./cmd/sidecar-bench

run: build ## start the sidecar on $SIDECAR_LISTEN in front of $SIDECAR_UPSTREAM
	$(BIN) serve --log-format text

test: ## vet, then every test with the race detector (bench/simulator and bench/ceiling, modules of their own, too; bench/redisclients is vetted), and proxy with the event loop and as shipped
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 20m $(PKGS)
	SIDECAR_TEST_EVENT_LOOP=1 $(GO) test -race -count=1 ./proxy/ # again with the event loop on (the binary's default)
	SIDECAR_TEST_EVENT_LOOP=1 $(GO) test -count=1 ./proxy/ # as shipped: the race detector's build makes rawConn's calls syscall's (rawio_race_linux.go)
	cd bench/simulator && $(GO) vet ./... && $(GO) test -race -count=1 ./...
	cd bench/ceiling && $(GO) vet ./... && $(GO) test -race -count=1 ./...
	cd bench/redisclients && $(GO) vet ./...
	cd bench/respparser && $(GO) vet ./...

test-race: test ## same as test (the race detector is always on)

test-hostile: ## the binary against a fault-injecting upstream and hostile clients for $(HOSTILE_DURATION); report in out/hostile.json
	SIDECAR_HOSTILE_DURATION=$(HOSTILE_DURATION) SIDECAR_HOSTILE_REPORT=$(CURDIR)/out/hostile.json \
	  $(GO) test -race -count=1 -v -timeout 20m -run 'Hostile' ./cmd/sidecar

test-differential: ## the differential test alone: app clients direct vs through the sidecar on a real llama-server (kill -9, idle closes, one key)
	KVSIDECAR_REQUIRE_LLAMA=1 $(GO) test -race -count=1 -v -timeout 20m -run 'TestDifferentialAgainstRealEngine' ./cmd/sidecar

test-llama-suite: build ## llama.cpp's own server tests (tools/server/tests at the shared build's commit) direct and through the sidecar (--engine generic, llamacpp); LLAMA_CPP_SRC=<llama.cpp checkout or git dir>; results in out/llama-suite
	scripts/llama-suite.sh

test-mcp: ## the MCP endpoint with the official TypeScript client (npm ci in test/mcp first), in front of a real llama-server
	npm ci --prefix test/mcp --no-audit --no-fund --loglevel=error
	KVSIDECAR_REQUIRE_NODE=1 KVSIDECAR_REQUIRE_LLAMA=1 $(GO) test -race -count=1 -v -run 'TestMCPRealClient' ./cmd/sidecar

bench-mcp: ## the session working memory design's test plan: full recalls per 10 messages on one topic, and at topic switches (Store.Recall, then through /mcp)
	$(GO) test -count=1 -v -run 'TestRecallDesignPlan' ./memory
	$(MAKE) test-mcp

bench: build ## go test benchmarks, then sidecar bench (amortization)
	$(GO) test -run '^$$' -bench . -benchtime 200x -timeout 30m $(PKGS)
	$(BIN) bench

bench-proxy: ## sidecar vs nginx side by side over a loopback upstream: 8 and 64 connections, streamed or not, pass-through and session path, req/s and CPU per 10K requests
	scripts/bench-proxy.sh

bench-proxy-wrk: build ## issue 25's own comparison: wrk -t1 -c8 (C=64 for more; TURNS=40 for a 28 KB chat history) POST chat completions, direct vs nginx vs the sidecar, alternated twice
	scripts/bench-proxy-wrk.sh

bench-proxy-ceiling: build ## the pass-through beside nginx and three Go yardsticks (bench/ceiling: an epoll event loop, net.Conn, bare fasthttp): req/s, p99, CPU per request, C=8 (needs wrk, nginx, perf)
	scripts/bench-proxy-ceiling.sh

bench-resp: build ## the RESP listener (--resp-listen) beside redis-server and a redcon yardstick (bench/respparser): SET/GET GB/s and p50/p99 at 1/8/32 MiB x 1/8/32 connections, a working set 4x RAM, kill -9
	cd bench/respparser && $(GO) build -o $(CURDIR)/$(dir $(BIN))respparser .
	@port=$$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'); \
	  $(dir $(BIN))respparser -listen 127.0.0.1:$$port & pid=$$!; \
	  $(BIN) bench resp --extra redcon=127.0.0.1:$$port $(RESP_ARGS); rc=$$?; kill $$pid; exit $$rc

bench-amortization: build ## cost per turn of a session prefix's KV, T = 1..64 (plot in out/amortization.svg)
	mkdir -p out
	$(BIN) bench amortization --plot out/amortization.svg

bench-sessions: build ## real llama-server, direct vs through the sidecar, one key and no user id: engine kill -9 after round 2 (no drain), then also a sidecar kill -9 after round 3, then each session its own user (plots in out/)
	mkdir -p out
	$(BIN) bench sessions --engine-restart-after 2 --plot out/sessions.svg
	$(BIN) bench sessions --engine-restart-after 2 --sidecar-restart-after 3 --plot out/sessions-sidecar-restart.svg
	$(BIN) bench sessions --engine-restart-after 2 --per-user --plot out/sessions-per-user.svg

bench-fleet: build ## two replicas (sidecar + llama-server) with and without a shared redis-server, one key and no user id: kill -9 of a replica after round 3 (no drain), of Redis after round 4
	$(BIN) bench fleet --kill-after 3 --redis-restart-after 4
	$(BIN) bench fleet --kill-after 3 --redis-restart-after 4 --sidecar-arg=--recall-share=0

bench-scale: build ## sessions at scale (issue 22): 100,000 new sessions in batches of 10,000 on a scripted upstream, each its own user, then without user ids (turn latency, RSS, open files, disk per session)
	$(BIN) bench scale --target 100000 --batch 10000
	$(BIN) bench scale --target 100000 --batch 10000 --no-user

fleet: build ## start Redis, two llama-servers and two sidecars sharing it (scripts/fleet.sh; Ctrl-C stops them)
	scripts/fleet.sh

docker-cuda: ## build the CUDA image kvsidecar:cuda (needs a Docker engine)
	docker build -f Dockerfile.cuda --build-arg VERSION=$(VERSION) -t kvsidecar:cuda .

bench-memory: ## window building at 10/100/1000 turns, tokenizer cold vs cached, log append per fsync policy
	$(GO) test ./memory -run '^$$' -bench 'Prepare|Count|LogAppend' -benchtime 300x

bench-memory-e2e: build ## LoCoMo replayed through a sidecar: context recall per client, prompt prefix sharing, on $(LOCOMO)
	$(BIN) bench memory --data $(LOCOMO)

bench-reliability: build ## issue 12 memory rows against the binary: huge words, SIGTERM, a 200 MB reply, ulimit -n 1024
	scripts/bench-reliability.sh $(BIN)

bench-kv: build ## KV tiers: hit rate vs Belady, latency, throughput, compression, amortization
	$(BIN) bench kv

bench-policy: ## hit ratio of every eviction strategy beside otter's W-TinyLFU and Belady, synthetic and recorded traces
	cd bench/simulator && $(GO) run .

bench-recall: build ## LoCoMo evidence recall (bm25, vector, hybrid, hybrid+graph) on $(LOCOMO)
	$(BIN) bench recall --data $(LOCOMO) --scale 100000

bench-archive: build ## archive compression on $(LOCOMO): text with zstd and a trained dictionary, vectors with PQ, summaries (ratio, decode speed, recall@10 loss)
	$(BIN) bench archive --data $(LOCOMO)

bench-preload: build ## predictive preload on a real llama-server: returning against resident sessions' time to first token, preload on and off, round-robin and shuffled
	$(BIN) bench sessions --follow-up --pause 1s
	$(BIN) bench sessions --follow-up --pause 1s --sidecar-arg=--llamacpp-preload=false
	$(BIN) bench sessions --follow-up --pause 1s --order shuffled
	$(BIN) bench sessions --follow-up --pause 1s --order shuffled --sidecar-arg=--llamacpp-preload=false

fuzz: ## run every fuzz target for $(FUZZTIME) each
	@for pkg in $$($(GO) list $(PKGS)); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

lint: ## gofmt and go vet, then check-deploy
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	cd bench/simulator && $(GO) vet ./...
	cd bench/ceiling && $(GO) vet ./...
	cd bench/redisclients && $(GO) vet ./...
	$(MAKE) check-deploy

check-deploy: ## promtool check rules and test rules on deploy/prometheus, then the rules and deploy/grafana against a live sidecar's /metrics (needs promtool: apt-get install prometheus)
	@command -v $(PROMTOOL) >/dev/null || { echo "check-deploy needs promtool (apt-get install prometheus, or PROMTOOL=path)"; exit 1; }
	$(PROMTOOL) check rules deploy/prometheus/*.rules.yml
	cd deploy/prometheus && $(PROMTOOL) test rules *.rules.test.yml
	KVSIDECAR_REQUIRE_PROMTOOL=1 KVSIDECAR_PROMTOOL=$$(command -v $(PROMTOOL)) $(GO) test -count=1 -run 'TestSelectors|TestDeploy' ./cmd/sidecar

clean: ## remove build output
	rm -rf bin out
