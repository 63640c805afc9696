#!/usr/bin/env bash
# test.sh — what `make test` runs: every test, integration tests included,
# after scripts/ensure-services.sh has installed and started MariaDB and
# RabbitMQ. A missing service fails the tests (OUTBOX_REQUIRE_INTEGRATION=1):
# never a skip.
#
# Two relay tests run in test processes of their own, beside the rest:
#   TestRelayOnCluster                 the RabbitMQ cluster faults: minutes of
#                                      waiting on Erlang nodes, off the
#                                      critical path of the relay package
#   TestRelayHeapFlatOverTransactions  reads the process's live heap, so no
#                                      other test may run in its process
# They run from one relay test binary built first (-c), which the main
# `go test` then only links again. The rest runs as
#   go test $TEST_FLAGS -skip '<those two>' $TEST_PKGS
#
# Builds are -trimpath (GOFLAGS): compiled packages do not depend on the
# checkout's folder, so a clean clone reuses the machine's build cache.
#
# Environment: GO (go), TEST_FLAGS (go test flags), TEST_PKGS (packages, in
# the order go test starts them), SOLO ("0" runs the two tests inside the
# relay package's own process instead).
set -uo pipefail
cd "$(dirname "$0")/.."

go=${GO:-go}
flags=${TEST_FLAGS:--count=1 -timeout 45m -p 2}
pkgs=${TEST_PKGS:-./relay/ ./cmd/... ./...}
export OUTBOX_REQUIRE_INTEGRATION=1
case " ${GOFLAGS:-} " in *" -trimpath "*) ;; *) export GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath" ;; esac

solo=(TestRelayOnCluster TestRelayHeapFlatOverTransactions)
skip=
case " $pkgs " in *" ./relay/ "* | *" ./... "*) [ "${SOLO:-1}" != 0 ] && skip=$(IFS='|' && echo "^(${solo[*]})\$") ;; esac

bin=$(mktemp -d "${TMPDIR:-/tmp}/outbox-relay-test-XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	rm -rf "$bin"
}
trap cleanup EXIT

if [ -n "$skip" ]; then
	echo "$go test -c -o relay.test ./relay/"
	# shellcheck disable=SC2086 # flags is a list of go test flags
	$go test -c -o "$bin/relay.test" ./relay/ || exit 1
	for name in "${solo[@]}"; do
		echo "relay.test -test.run '^$name\$' (in the background; its output when it ends)"
		(
			began=$SECONDS
			cd relay && "$bin/relay.test" -test.run "^$name\$" -test.count=1 -test.timeout 45m ${SOLO_FLAGS:-} >"$bin/$name.log" 2>&1
			rc=$?
			cat "$bin/$name.log"
			if [ $rc -eq 0 ]; then word=ok; else word=FAIL; fi
			printf '%s\t%s (%s)\t%ds\n' "$word" "github.com/outbox-relay/outbox-relay/relay" "$name" $((SECONDS - began))
			exit $rc
		) &
		pids+=($!)
	done
fi

echo "$go test $flags${skip:+ -skip '$skip'} $pkgs"
# shellcheck disable=SC2086 # flags and pkgs are lists
$go test $flags ${skip:+-skip "$skip"} $pkgs
rc=$?
for p in "${pids[@]}"; do
	wait "$p" || rc=1
done
pids=()
exit $rc
