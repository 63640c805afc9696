#!/usr/bin/env bash
# demo.sh — the relay end to end on local defaults (`make demo`):
#   1. makes sure MariaDB's binaries and RabbitMQ are installed and RabbitMQ runs
#   2. starts a private binlog-enabled MariaDB in .demo/ on 127.0.0.1:${DEMO_MYSQL_PORT:-3307}
#      (the machine's own server has its binlog off)
#   3. builds the relay, migrates the demo database, starts `outbox-relay run`
#   4. runs a producer and a consumer (examples/demo) that print every message
#      with its commit → receive latency; stops after DEMO_COUNT messages or Ctrl-C
# Everything it started is stopped on exit; .demo/ keeps the data and logs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

port=${DEMO_MYSQL_PORT:-3307}
count=${DEMO_COUNT:-100}
rate=${DEMO_RATE:-20}
dir=$PWD/.demo
dsn="root@tcp(127.0.0.1:${port})/demo"
amqp=${DEMO_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}

scripts/ensure-services.sh

mkdir -p "$dir"
cat >"$dir/my.cnf" <<CNF
[mysqld]
user=root
datadir=$dir/mysql
socket=$dir/mysqld.sock
pid-file=$dir/mysqld.pid
port=$port
bind-address=127.0.0.1
skip-name-resolve
log-bin=demo-bin
server-id=1
binlog-format=ROW
binlog-row-image=FULL
binlog-row-metadata=FULL
gtid-strict-mode=ON
character-set-server=utf8mb4
collation-server=utf8mb4_unicode_ci
innodb-buffer-pool-size=64M
log-error=$dir/mysqld.err
CNF

mysql_cli() { mariadb --defaults-file=/dev/null -uroot -h127.0.0.1 -P"$port" --connect-timeout=2 "$@"; }

pids=()
cleanup() { # one at a time: the relay acknowledges its last confirms before the database stops
	for pid in "${pids[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
}
trap cleanup EXIT

if ! mysql_cli -e 'select 1' >/dev/null 2>&1; then
	if [ ! -d "$dir/mysql/mysql" ]; then
		echo "demo: initialising a private MariaDB in $dir/mysql"
		mariadb-install-db --defaults-file="$dir/my.cnf" --auth-root-authentication-method=normal \
			--skip-test-db >"$dir/install.log" 2>&1 || { cat "$dir/install.log"; exit 1; }
	fi
	echo "demo: starting a private binlog-enabled MariaDB on 127.0.0.1:$port"
	mariadbd --defaults-file="$dir/my.cnf" >"$dir/mysqld.out" 2>&1 &
	pids+=($!)
	for _ in $(seq 1 150); do
		mysql_cli -e 'select 1' >/dev/null 2>&1 && break
		sleep 0.2
	done
	mysql_cli -e 'select 1' >/dev/null || { tail -n 20 "$dir/mysqld.err"; exit 1; }
fi
mysql_cli -e 'CREATE DATABASE IF NOT EXISTS demo'

make -s build
bin/outbox-relay migrate --mysql-dsn "$dsn"
echo "demo: starting the relay (log: .demo/relay.log)"
bin/outbox-relay run --mysql-dsn "$dsn" --amqp-url "$amqp" --default-exchange outbox-demo \
	--log-format console >"$dir/relay.log" 2>&1 &
pids=("$!" "${pids[@]}") # stop the relay before the database
go run ./examples/demo --mysql-dsn "$dsn" --amqp-url "$amqp" --exchange outbox-demo --count "$count" --rate "$rate"
