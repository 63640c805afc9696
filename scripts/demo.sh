#!/usr/bin/env bash
# demo.sh — the relay end to end on local defaults (`make demo`):
#   1. makes sure MariaDB's binaries and RabbitMQ are installed and RabbitMQ runs
#   2. starts a private binlog-enabled MariaDB in .demo/ on 127.0.0.1:${DEMO_MYSQL_PORT:-3307}
#      (the machine's own server has its binlog off)
#   3. builds the relay, migrates the demo database, starts `outbox-relay run`
#   4. runs a producer and a consumer (examples/demo) that print every message
#      with its commit → receive latency; the consumer applies each message once
#      through the inbox (package dedup) and skips the copies the demo replays;
#      stops after DEMO_COUNT messages or Ctrl-C
# Everything it started is stopped on exit; .demo/ keeps the data and logs.
set -euo pipefail
cd "$(dirname "$0")/.."

port=${DEMO_MYSQL_PORT:-3307}
count=${DEMO_COUNT:-100}
rate=${DEMO_RATE:-20}
dir=$PWD/.demo
dsn="root@tcp(127.0.0.1:${port})/demo"
amqp=${DEMO_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}

scripts/ensure-services.sh
relay_pid=
# delete_exchange removes the demo's exchange from the broker once the relay
# has stopped publishing to it (the demo's queue is exclusive and goes by
# itself), so the demo leaves nothing behind. A shell has no AMQP client:
# this asks the local node with rabbitmqctl, and for another broker (or
# without rabbitmqctl's rights) says what to delete.
delete_exchange() {
	local ctl
	ctl=$(command -v rabbitmqctl || echo /usr/sbin/rabbitmqctl)
	if [ "$amqp" = "amqp://guest:guest@127.0.0.1:5672/" ] && [ -x "$ctl" ] &&
		"$ctl" -q eval 'rabbit_exchange:delete(rabbit_misc:r(<<"/">>, exchange, <<"outbox-demo">>), false, <<"outbox-demo">>).' >/dev/null 2>&1; then
		return
	fi
	echo "demo: delete the exchange outbox-demo from the broker yourself if you do not want it kept" >&2
}
cleanup() { # the relay first: it acknowledges its last confirms before the database stops
	if [ -n "$relay_pid" ]; then
		kill -TERM "$relay_pid" 2>/dev/null || true
		wait "$relay_pid" 2>/dev/null || true
		delete_exchange
	fi
	scripts/private-mariadb.sh stop "$dir" "$port"
}
trap cleanup EXIT
scripts/private-mariadb.sh start "$dir" "$port"
mariadb --defaults-file=/dev/null -uroot -h127.0.0.1 -P"$port" -e 'CREATE DATABASE IF NOT EXISTS demo'

make -s build
bin/outbox-relay migrate --mysql-dsn "$dsn"
echo "demo: starting the relay (log: .demo/relay.log)"
bin/outbox-relay run --mysql-dsn "$dsn" --amqp-url "$amqp" --default-exchange outbox-demo \
	--log-format console >"$dir/relay.log" 2>&1 &
relay_pid=$!
go run ./examples/demo --mysql-dsn "$dsn" --amqp-url "$amqp" --exchange outbox-demo --count "$count" --rate "$rate"
