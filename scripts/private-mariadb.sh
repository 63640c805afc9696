#!/usr/bin/env bash
# private-mariadb.sh start|stop DIR PORT — a private binlog-enabled MariaDB for
# `make demo` and `make bench` (the machine's own server has its binlog off).
#   start: initialise DIR/mysql if needed, start mariadbd on 127.0.0.1:PORT in
#          the background (pid in DIR/mysqld.pid) and wait until it answers;
#          nothing to do when it already answers
#   stop:  stop the server started from DIR, waiting until it has exited
set -euo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
cmd=${1:?usage: private-mariadb.sh start|stop DIR PORT}
dir=${2:?usage: private-mariadb.sh start|stop DIR PORT}
port=${3:?usage: private-mariadb.sh start|stop DIR PORT}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

mysql_cli() { mariadb --defaults-file=/dev/null -uroot -h127.0.0.1 -P"$port" --connect-timeout=2 "$@"; }

case $cmd in
start)
	mysql_cli -e 'select 1' >/dev/null 2>&1 && exit 0
	cat >"$dir/my.cnf" <<CNF
[mysqld]
user=root
datadir=$dir/mysql
socket=$dir/mysqld.sock
pid-file=$dir/mysqld.pid
port=$port
bind-address=127.0.0.1
skip-name-resolve
log-bin=private-bin
server-id=1
binlog-format=ROW
binlog-row-image=FULL
binlog-row-metadata=FULL
gtid-strict-mode=ON
character-set-server=utf8mb4
collation-server=utf8mb4_unicode_ci
innodb-buffer-pool-size=256M
max-allowed-packet=64M
log-error=$dir/mysqld.err
CNF
	if [ ! -d "$dir/mysql/mysql" ]; then
		echo "private-mariadb: initialising $dir/mysql"
		mariadb-install-db --defaults-file="$dir/my.cnf" --auth-root-authentication-method=normal \
			--skip-test-db >"$dir/install.log" 2>&1 || { cat "$dir/install.log" >&2; exit 1; }
	fi
	echo "private-mariadb: starting a binlog-enabled MariaDB on 127.0.0.1:$port"
	setsid mariadbd --defaults-file="$dir/my.cnf" >"$dir/mysqld.out" 2>&1 </dev/null &
	for _ in $(seq 1 150); do
		mysql_cli -e 'select 1' >/dev/null 2>&1 && exit 0
		sleep 0.2
	done
	tail -n 20 "$dir/mysqld.err" >&2
	echo "private-mariadb: no answer on 127.0.0.1:$port within 30s" >&2
	exit 1
	;;
stop)
	[ -f "$dir/mysqld.pid" ] || exit 0
	pid=$(cat "$dir/mysqld.pid")
	kill -TERM "$pid" 2>/dev/null || exit 0
	for _ in $(seq 1 300); do
		kill -0 "$pid" 2>/dev/null || exit 0
		sleep 0.1
	done
	echo "private-mariadb: server $pid did not stop within 30s" >&2
	exit 1
	;;
*)
	echo "usage: private-mariadb.sh start|stop DIR PORT" >&2
	exit 2
	;;
esac
