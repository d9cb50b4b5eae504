#!/usr/bin/env bash
# Installs (Debian's packages) and starts on 127.0.0.1 the servers the tests and benchmarks use:
# PostgreSQL :5432, MariaDB :3306, redis-server :6379 (the benchmark peer), plus the tools of
# the fault tests and bench/floor.sh (faketime, tmux, haproxy, gcc, liburing-dev). Idempotent: a server
# already answering is left alone. Test-only credentials: postgres and root need no password
# over loopback. ZooKeeper and Prometheus are started by the tests themselves.
#   scripts/services.sh
set -euo pipefail

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
  for _ in $(seq 1 60); do port_open "$1" && return 0; sleep 0.5; done
  echo "$2 did not open 127.0.0.1:$1" >&2
  return 1
}
apt_updated=0
apt_install() { # apt_install PACKAGE...
  [ "$apt_updated" = 1 ] || { apt-get update -qq; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
need() { # need COMMAND PACKAGE...
  command -v "$1" >/dev/null || apt_install "${@:2}"
}

# PostgreSQL: the machine may have the package; create a cluster if there is none.
need pg_ctlcluster postgresql
if ! port_open 5432; then
  version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
  [ -d "/etc/postgresql/$version/main" ] || pg_createcluster "$version" main >/dev/null
  hba="/etc/postgresql/$version/main/pg_hba.conf"
  if ! grep -q "leafd tests" "$hba"; then
    { echo "# leafd tests: loopback needs no password"
      echo "host all all 127.0.0.1/32 trust"
      echo "host all all ::1/128 trust"
      cat "$hba"; } > "$hba.new"
    mv "$hba.new" "$hba"
  fi
  pg_ctlcluster --skip-systemctl-redirect "$version" main start
  wait_port 5432 PostgreSQL
fi

# MariaDB: Debian's server, root reachable over TCP without a password.
need mariadbd mariadb-server mariadb-client
if ! port_open 3306; then
  install -d -o mysql -g mysql /run/mysqld
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- \
    --user=mysql --bind-address=127.0.0.1 --port=3306
  wait_port 3306 MariaDB
fi
# Password first: sqlx does not follow a switch to the unix_socket plugin.
mysql -uroot -e "ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket"

# redis-server, the peer of bench/compare.sh; no persistence.
need redis-server redis-server redis-tools
if ! port_open 6379; then
  redis-server --port 6379 --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --logfile /tmp/leafd-ci-redis.log >/dev/null
  wait_port 6379 redis-server
fi

# Tools the tests drive: faketime (clock steps across restarts), tmux (interactive redis-cli).
need faketime faketime
need tmux tmux
need haproxy haproxy
# bench/floor.sh builds its measuring sticks with gcc, the io_uring one against liburing.
need gcc gcc libc6-dev
[ -r /usr/include/liburing.h ] || apt_install liburing-dev
echo "PostgreSQL, MariaDB and redis-server answer on 127.0.0.1"
