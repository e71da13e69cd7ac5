GO ?= go

.PHONY: test lint bench build e2e e2e-bench only-go image push

build:
	$(GO) build -buildvcs=auto -o bin/scd2sink ./cmd/scd2sink

# The container image: one name everywhere (docker-compose.yml, the
# Kubernetes StatefulSet, docs/operations.md). `make image` builds it from
# the Dockerfile, tagged with the version it prints; `make push` pushes it;
# IMAGE=registry.example.com/team/scd2sink make image push for your own.
IMAGE ?= ghcr.io/scd2sink/scd2sink
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

image:
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) -t $(IMAGE):latest .

push: image
	docker push $(IMAGE):$(VERSION)
	docker push $(IMAGE):latest

# The packages whose tests take longest go first, three test binaries at a
# time: their tests wait on PostgreSQL and on Kafka's timers as much as
# they compute, so a third binary fills the two cores (on the 2-core CI
# machine: 281 s in the default order, two at a time; 177 s so).
TEST_PKGS = ./sink/ ./cmd/... ./consumer/ ./internal/app/ ./...
TEST_P ?= 3

# The test command CI runs (see README.md): static checks, then every test
# against a real, throwaway PostgreSQL.
test: lint
	$(GO) test -count=1 -p $(TEST_P) -timeout 20m $(TEST_PKGS)
	# What a rebalance callback shares with the applying goroutine, and the
	# parts of a batch applied side by side, new tables made side by side,
	# small shares' writes queued together, and the quiet release beside the
	# watermark looks, under the race detector.
	$(GO) test -race -short -count=1 -run 'TestForgetWhileApplying|TestFoldPropertyParallel|TestSplitBatchFailure|TestManyNewTablesInNewSchema|TestQueued' ./sink/
	$(GO) test -race -short -count=1 -run 'TestQuiet' ./consumer/

# Only Go: the demo and every package's tests with PostgreSQL's binaries
# hidden, on the embedded PostgreSQL (as root: it uses a mount namespace).
only-go:
	sh .ci/only-go

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags e2e ./e2e/
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 -tags e2e ./e2e/

# Benchmarks: our events/s against a raw COPY of the same rows in the same
# run, as a ratio. BenchmarkApply: the engine (sink) alone; BenchmarkPipeline:
# the real binary from an in-process Kafka to the history table, with its peak RSS.
# BenchmarkSize: the cost of a history table of BENCH_SIZES versions (about
# 25 minutes with 50 M, and 30 GB of disk); BenchmarkRebuild: rebuild's time.
BENCH_SIZES ?= 1000000,10000000,50000000
bench:
	$(GO) test -run '^$$' -bench 'BenchmarkApply|BenchmarkGrowth' -benchtime 1x -timeout 30m ./sink/
	BENCH_SIZES=$(BENCH_SIZES) $(GO) test -run '^$$' -bench BenchmarkSize -benchtime 1x -timeout 180m ./sink/
	$(GO) test -run '^$$' -bench 'BenchmarkPipeline|BenchmarkLatency|BenchmarkManyTables|BenchmarkRebuild' -benchtime 1x -timeout 30m ./cmd/scd2sink/

# The real stack (e2e/): Apache Kafka, Kafka Connect and Debezium from Maven
# Central jars (cached in ~/.cache/scd2sink-e2e), source and target
# PostgreSQL from the local binaries; needs java and mvn.
e2e:
	cd e2e && $(GO) test -tags e2e -count=1 -v -timeout 25m .

# The peer benchmark on the real stack: Debezium's JDBC sink against scd2sink
# over the same backlog of 200,000 events (docs/benchmarks.md).
e2e-bench:
	cd e2e && E2E_BENCH=1 $(GO) test -tags e2e -count=1 -v -timeout 40m -run 'TestPeerBenchmark|TestMixedBenchmark' .
