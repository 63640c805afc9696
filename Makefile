# outbox-relay — build, test and lint.
#
#   make build       the binary, bin/outbox-relay
#   make test        installs/starts MariaDB and RabbitMQ if needed, then all tests
#   make lint        gofmt (must list nothing), go vet, deploy files (scripts/lint-deploy.sh)
#   make demo        the relay end to end: private MariaDB, RabbitMQ, producer, consumer
#   make bench       outbox-relay bench on a private binlog-enabled MariaDB (BENCH_FLAGS=...)
#   make tidy-check  go.mod and go.sum are tidy (does not change them)
#   make fuzz        each fuzz target for FUZZTIME (default 60s), one after the other

GO        ?= go
# Test binaries run with private MariaDB servers and share the broker: two
# packages at a time suits a 2-core machine. No test waits on a fixed time
# for a whole workload (their waits fail when nothing moves for
# internal/progress.Patience), so the binary's -timeout is only the last
# guard against a hang, far above what a slow machine needs.
TEST_P    ?= 2
TEST_FLAGS ?= -count=1 -timeout 45m -p $(TEST_P)
# go test runs packages in the order given: the two longest (relay, about
# 5 min without the RabbitMQ cluster faults, and cmd/outbox-relay, about
# 6) start first, side by side, and the short ones fill in after them.
# Three at a time was measured too: 547 s against 529 s for two (the
# longest package only grew), so two it stays.
TEST_PKGS ?= ./relay/ ./cmd/... ./...

.PHONY: build test lint tidy-check demo bench fuzz

build:
	$(GO) build -o bin/outbox-relay ./cmd/outbox-relay

# A missing service fails the tests here as in CI: never a skip. The
# RabbitMQ cluster faults and the relay's heap test run in test processes of
# their own beside the rest (scripts/test.sh says why).
test:
	scripts/ensure-services.sh
	GO='$(GO)' TEST_FLAGS='$(TEST_FLAGS)' TEST_PKGS='$(TEST_PKGS)' scripts/test.sh

demo:
	scripts/demo.sh

bench:
	scripts/bench.sh $(BENCH_FLAGS)

lint:
	@unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then \
		echo "gofmt: these files need formatting (run gofmt -w):"; \
		echo "$$unformatted"; \
		exit 1; \
	fi
	$(GO) vet ./...
	scripts/lint-deploy.sh

# -diff prints what tidy would change and fails if anything; it changes nothing.
tidy-check:
	$(GO) mod tidy -diff

# The fuzz targets of the parsers of what producers and operators write
# (package:target). Their seed corpora (testdata/fuzz/<target>/) run as
# ordinary tests with `make test`; here each target is fuzzed for FUZZTIME
# with FUZZ_FLAGS (one worker by default: the machines are shared), see
# scripts/fuzz.sh. A failing input is written to the package's
# testdata/fuzz/<target>/: commit it with the fix.
FUZZTIME   ?= 60s
FUZZ_FLAGS ?= -parallel=1
FUZZ_TARGETS = \
	./position:FuzzGTIDSet ./position:FuzzMissing \
	./canal:FuzzRecordDecode ./publish:FuzzFromRecord \
	./cmd/outbox-relay:FuzzConfigFile ./cmd/outbox-relay:FuzzReplayFilters

fuzz:
	FUZZ_FLAGS='$(FUZZ_FLAGS)' GO='$(GO)' scripts/fuzz.sh $(FUZZTIME) $(FUZZ_TARGETS)
