#!/usr/bin/env bash
# ensure-services.sh — make sure the services `make test` needs are installed and
# running on a Debian 12 machine, and wait until they answer:
#
#   MariaDB   mariadbd and mariadb-install-db (the tests start private servers
#             from them) and the system server on 127.0.0.1:3306, root without
#             a password over TCP
#   RabbitMQ  on 127.0.0.1:5672, guest/guest, with the rabbitmq_stream plugin
#             (the stream protocol on 127.0.0.1:5552)
#
# Idempotent: installs packages (apt-get) only when missing and starts a service
# only when it does not answer; about half a second when everything is up.
# Prints one line per step; exits non-zero with the reason when something cannot
# be installed or started.
set -euo pipefail

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
readonly WAIT_SECONDS=${ENSURE_SERVICES_WAIT:-90} # per service, bounded

step() { printf 'ensure-services: %s\n' "$*"; }
die() {
	printf 'ensure-services: FAILED: %s\n' "$*" >&2
	exit 1
}

# as_root runs a command as root: directly, or through non-interactive sudo.
as_root() {
	if [ "$(id -u)" -eq 0 ]; then
		"$@"
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		sudo -n "$@"
	else
		die "need root (or password-less sudo) to run: $*"
	fi
}

# wait_until runs "$@" until it succeeds or WAIT_SECONDS pass.
wait_until() {
	local deadline=$((SECONDS + WAIT_SECONDS))
	until "$@" >/dev/null 2>&1; do
		[ "$SECONDS" -lt "$deadline" ] || return 1
		sleep 0.2
	done
}

mariadb_answers() { timeout 10 mariadb -uroot -h127.0.0.1 -P3306 --connect-timeout=5 -e 'select 1'; }
mariadb_socket_answers() { as_root timeout 10 mariadb -uroot --connect-timeout=5 -e 'select 1'; }
mariadb_up() { mariadb_answers || mariadb_socket_answers; }
rabbitmq_answers() {
	timeout 15 rabbitmq-diagnostics -q ping && timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/5672'
}

stream_answers() { timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/5552'; }

# --- packages ----------------------------------------------------------------
missing=()
for bin in mariadbd mariadb-install-db mariadb; do
	command -v "$bin" >/dev/null 2>&1 || { missing+=(mariadb-server mariadb-client); break; }
done
for bin in rabbitmq-server rabbitmqctl rabbitmq-diagnostics; do
	command -v "$bin" >/dev/null 2>&1 || { missing+=(rabbitmq-server); break; }
done
if [ "${#missing[@]}" -gt 0 ]; then
	step "installing ${missing[*]} with apt-get"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null ||
		die "apt-get update failed"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
		die "apt-get install ${missing[*]} failed"
fi
for bin in mariadbd mariadb-install-db mariadb rabbitmq-server rabbitmqctl rabbitmq-diagnostics; do
	command -v "$bin" >/dev/null 2>&1 || die "$bin not found after installing its package"
done
step "packages: mariadb-server and rabbitmq-server installed"

# --- MariaDB -----------------------------------------------------------------
if mariadb_answers >/dev/null 2>&1; then
	step "MariaDB: answering on 127.0.0.1:3306"
else
	if ! mariadb_socket_answers >/dev/null 2>&1; then
		step "MariaDB: starting $(command -v mariadbd)"
		# The packaged server runs as mysql and keeps its socket in /run/mysqld,
		# which nothing creates on a machine without systemd.
		as_root install -d -o mysql -g mysql -m 0755 /run/mysqld /var/log/mysql 2>/dev/null || true
		as_root start-stop-daemon --start --oknodo --background --exec "$(command -v mariadbd)" ||
			die "start-stop-daemon could not start mariadbd"
		if ! wait_until mariadb_up; then
			tail -n 20 /var/log/mysql/error.log 2>/dev/null >&2 || true
			die "MariaDB did not answer within ${WAIT_SECONDS}s (log above, if any)"
		fi
	fi
	if ! mariadb_answers >/dev/null 2>&1; then
		# A fresh Debian install lets root in only through the unix socket; the
		# tests and the docs use root without a password over TCP.
		step "MariaDB: allowing root without a password over TCP from 127.0.0.1"
		as_root mariadb -uroot -e "ALTER USER root@localhost IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('');
			CREATE USER IF NOT EXISTS root@'127.0.0.1' IDENTIFIED BY '';
			GRANT ALL PRIVILEGES ON *.* TO root@'127.0.0.1' WITH GRANT OPTION;" ||
			die "could not enable root login over TCP"
		mariadb_answers >/dev/null 2>&1 || die "MariaDB: root still cannot log in over TCP on 127.0.0.1:3306"
	fi
	step "MariaDB: answering on 127.0.0.1:3306"
fi

# --- RabbitMQ ----------------------------------------------------------------
if rabbitmq_answers >/dev/null 2>&1; then
	step "RabbitMQ: answering on 127.0.0.1:5672"
else
	step "RabbitMQ: starting rabbitmq-server -detached"
	as_root rabbitmq-server -detached || die "rabbitmq-server -detached failed"
	if ! wait_until rabbitmq_answers; then
		ls -t /var/log/rabbitmq/*.log 2>/dev/null | head -n 1 | xargs -r tail -n 20 >&2 || true
		die "RabbitMQ did not answer on 127.0.0.1:5672 within ${WAIT_SECONDS}s (log above, if any)"
	fi
	step "RabbitMQ: answering on 127.0.0.1:5672"
fi
# The stream destination and its tests speak the stream protocol; the plugin is
# off in a fresh install. Enabling it on a running node needs no restart.
if ! stream_answers >/dev/null 2>&1; then
	step "RabbitMQ: enabling rabbitmq_stream"
	as_root rabbitmq-plugins enable rabbitmq_stream >/dev/null ||
		die "rabbitmq-plugins enable rabbitmq_stream failed"
	wait_until stream_answers ||
		die "RabbitMQ stream protocol did not answer on 127.0.0.1:5552 within ${WAIT_SECONDS}s"
fi
step "RabbitMQ: stream protocol answering on 127.0.0.1:5552"
step "all services up"
