# kvsidecar — run `make help` for the targets.
GO       ?= go
BIN      ?= bin/sidecar
BENCHBIN ?= $(dir $(BIN))sidecar-bench
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS  := -s -w -X main.version=$(VERSION)
GOBUILD   = CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)'
PKGS     := ./...
FUZZTIME ?= 30s
LOCOMO   ?= ../shared/data/locomo-dev.json
HOSTILE_DURATION ?= 60s
PROMTOOL ?= promtool

# The sidecar reads SIDECAR_LISTEN, SIDECAR_UPSTREAM, SIDECAR_DATA_DIR, …
# from the environment (make run SIDECAR_UPSTREAM=http://127.0.0.1:8000
# passes one); unset, serve's defaults hold.

.PHONY: help run test demo-llama build test-race test-hostile test-differential test-llama-suite test-mcp fuzz lint check-deploy bench bench-proxy bench-proxy-wrk bench-proxy-ceiling bench-kv bench-policy bench-amortization bench-sessions bench-preload bench-fleet bench-scale bench-memory bench-memory-e2e bench-recall bench-archive bench-reliability bench-mcp bench-resp fleet docker-cuda clean

##@ Start here

help: ## this list
	@awk -v vars='HOSTILE_DURATION=$(HOSTILE_DURATION) LOCOMO=$(LOCOMO) FUZZTIME=$(FUZZTIME)' -f scripts/help.awk $(MAKEFILE_LIST)

run: ## build and start bin/sidecar; with no SIDECAR_UPSTREAM and nothing at :8000, before a demo upstream
	$(GOBUILD) -o $(BIN) ./cmd/sidecar
	$(BIN) serve --log-format text --demo

test: ## go vet, then every test with the race detector, in parallel groups (scripts/test.sh)
	GO=$(GO) scripts/test.sh

demo-llama: build ## the sidecar before a real llama-server (../shared/llama or PATH): KV restored, memory recalled
	$(BIN) bench demo-llama

build: ## build bin/sidecar and bin/sidecar-bench (the benchmarks), static, no cgo
	$(GOBUILD) -o $(BIN) ./cmd/sidecar
	$(GOBUILD) -o $(BENCHBIN) ./cmd/sidecar-bench

##@ More tests

test-race: test ## the same as test: the race detector is always on

test-hostile: ## the binary against a faulty upstream and hostile clients for $(HOSTILE_DURATION); report in out/hostile.json
	SIDECAR_HOSTILE_DURATION=$(HOSTILE_DURATION) SIDECAR_HOSTILE_REPORT=$(CURDIR)/out/hostile.json \
	  $(GO) test -race -count=1 -v -timeout 20m -run 'Hostile' ./cmd/sidecar

test-differential: ## app clients direct vs through the sidecar on a real llama-server (kill -9, idle closes, one key)
	KVSIDECAR_REQUIRE_LLAMA=1 $(GO) test -race -count=1 -v -timeout 20m -run 'TestDifferentialAgainstRealEngine' ./cmd/sidecar

test-llama-suite: build ## llama.cpp's own server tests direct and through (LLAMA_CPP_SRC=<llama.cpp checkout>)
	scripts/llama-suite.sh

test-mcp: ## the MCP endpoint driven by the official TypeScript client, before a real llama-server
	npm ci --prefix test/mcp --no-audit --no-fund --loglevel=error
	KVSIDECAR_REQUIRE_NODE=1 KVSIDECAR_REQUIRE_LLAMA=1 $(GO) test -race -count=1 -v -run 'TestMCPRealClient' ./cmd/sidecar

fuzz: ## every fuzz target for $(FUZZTIME) each
	@for pkg in $$($(GO) list $(PKGS)); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

lint: ## gofmt and go vet (every module), then check-deploy
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet -race $(PKGS) # -race: the build make test reuses
	cd bench/simulator && $(GO) vet ./...
	cd bench/ceiling && $(GO) vet ./...
	cd bench/redisclients && $(GO) vet ./...
	cd bench/respparser && $(GO) vet ./...
	cd bench/walk && $(GO) vet ./...
	$(MAKE) check-deploy

check-deploy: ## promtool on deploy/prometheus, then the rules and dashboard against a live /metrics
	@command -v $(PROMTOOL) >/dev/null || { echo "check-deploy needs promtool (apt-get install prometheus, or PROMTOOL=path)"; exit 1; }
	$(PROMTOOL) check rules deploy/prometheus/*.rules.yml
	cd deploy/prometheus && $(PROMTOOL) test rules *.rules.test.yml
	KVSIDECAR_REQUIRE_PROMTOOL=1 KVSIDECAR_PROMTOOL=$$(command -v $(PROMTOOL)) $(GO) test -race -count=1 -run 'TestSelectors|TestDeploy' ./cmd/sidecar

##@ Benchmarks (numbers and commands in docs/BENCHMARKS.md)

bench: build ## go test benchmarks of every package, then sidecar bench (KV amortization)
	$(GO) test -run '^$$' -bench . -benchtime 200x -timeout 30m $(PKGS)
	$(BIN) bench

bench-proxy: ## sidecar vs nginx over a loopback upstream: 8 and 64 connections, req/s, CPU per 10K requests
	scripts/bench-proxy.sh

bench-proxy-wrk: build ## wrk -t1 -c8 chat completions: direct vs nginx vs the sidecar (C=64, TURNS=40 to vary)
	scripts/bench-proxy-wrk.sh

bench-proxy-ceiling: build ## the pass-through beside nginx and three Go yardsticks (needs wrk, nginx, perf)
	scripts/bench-proxy-ceiling.sh

bench-kv: build ## KV tiers: hit rate vs Belady, latency, throughput, compression, amortization
	$(BIN) bench kv

bench-policy: ## hit ratio of every eviction strategy beside otter's W-TinyLFU and Belady
	cd bench/simulator && $(GO) run .

bench-amortization: build ## cost per turn of a session prefix's KV, T = 1..64 (plot in out/amortization.svg)
	mkdir -p out
	$(BIN) bench amortization --plot out/amortization.svg

bench-sessions: build ## a real llama-server direct vs through the sidecar, kill -9 of either (plots in out/)
	mkdir -p out
	$(BIN) bench sessions --engine-restart-after 2 --plot out/sessions.svg
	$(BIN) bench sessions --engine-restart-after 2 --sidecar-restart-after 3 --plot out/sessions-sidecar-restart.svg
	$(BIN) bench sessions --engine-restart-after 2 --per-user --plot out/sessions-per-user.svg

bench-preload: build ## predictive preload on a real llama-server: time to first token, preload on and off
	$(BIN) bench sessions --follow-up --pause 1s
	$(BIN) bench sessions --follow-up --pause 1s --sidecar-arg=--llamacpp-preload=false
	$(BIN) bench sessions --follow-up --pause 1s --order shuffled
	$(BIN) bench sessions --follow-up --pause 1s --order shuffled --sidecar-arg=--llamacpp-preload=false

bench-fleet: build ## two replicas with and without a shared Redis, kill -9 of a replica and of Redis
	$(BIN) bench fleet --kill-after 3 --redis-restart-after 4
	$(BIN) bench fleet --kill-after 3 --redis-restart-after 4 --sidecar-arg=--recall-share=0

bench-scale: build ## 100,000 sessions on a scripted upstream: turn latency, RSS, open files, disk per session
	$(BIN) bench scale --target 100000 --batch 10000
	$(BIN) bench scale --target 100000 --batch 10000 --no-user

bench-memory: ## window building at 10/100/1000 turns, tokenizer cold vs cached, log append per fsync
	$(GO) test ./memory -run '^$$' -bench 'Prepare|Count|LogAppend' -benchtime 300x

bench-memory-e2e: build ## LoCoMo through a sidecar: recall per client, prompt prefix sharing ($(LOCOMO))
	$(BIN) bench memory --data $(LOCOMO)

bench-recall: build ## LoCoMo evidence recall: bm25, vector, hybrid, hybrid+graph ($(LOCOMO))
	$(BIN) bench recall --data $(LOCOMO) --scale 100000

bench-archive: build ## archive compression: zstd with a dictionary, PQ vectors, summaries ($(LOCOMO))
	$(BIN) bench archive --data $(LOCOMO)

bench-reliability: build ## memory under hostile input: huge words, SIGTERM, a 200 MB reply, ulimit -n 1024
	scripts/bench-reliability.sh $(BIN)

bench-mcp: ## session_recall: full recalls per 10 messages on one topic and at topic switches
	$(GO) test -count=1 -v -run 'TestRecallDesignPlan' ./memory
	$(MAKE) test-mcp

bench-resp: build ## the RESP listener beside redis-server and redcon: GB/s, p50/p99, 4x RAM, kill -9
	cd bench/respparser && $(GO) build -o $(CURDIR)/$(dir $(BIN))respparser .
	@port=$$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'); \
	  $(dir $(BIN))respparser -listen 127.0.0.1:$$port & pid=$$!; \
	  $(BIN) bench resp --extra redcon=127.0.0.1:$$port $(RESP_ARGS); rc=$$?; kill $$pid; exit $$rc

##@ Deploy and clean up

fleet: ## Redis, two llama-servers and two sidecars sharing it (scripts/fleet.sh; Ctrl-C stops)
	$(GOBUILD) -o $(BIN) ./cmd/sidecar
	SIDECAR=$(BIN) scripts/fleet.sh

docker-cuda: ## build the CUDA image kvsidecar:cuda (needs Docker)
	docker build -f Dockerfile.cuda --build-arg VERSION=$(VERSION) -t kvsidecar:cuda .

clean: ## remove bin/ and out/
	rm -rf bin out
