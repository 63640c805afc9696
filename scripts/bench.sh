#!/usr/bin/env bash
# bench.sh [bench flags] — `make bench`: a private binlog-enabled MariaDB in
# .bench/ on 127.0.0.1:${BENCH_MYSQL_PORT:-3308}, then `outbox-relay bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${BENCH_MYSQL_PORT:-3308}
dir=$PWD/.bench
scripts/ensure-services.sh >/dev/null
trap 'scripts/private-mariadb.sh stop "$dir" "$port"' EXIT
scripts/private-mariadb.sh start "$dir" "$port" >&2
mariadb --defaults-file=/dev/null -uroot -h127.0.0.1 -P"$port" -e 'CREATE DATABASE IF NOT EXISTS bench'
make -s build >&2
bin/outbox-relay bench --mysql-dsn "root@tcp(127.0.0.1:${port})/bench" "$@"
