#!/usr/bin/env bash
# A real PostgreSQL for the stats-server's tests: Debian's postgresql, its default cluster
# started, and a role and database `ceems_test` (password `ceems_test`, on 127.0.0.1) for the
# tests alone. Idempotent; needs root. Prints the database's URL.
#   scripts/postgres-lab.sh          set up and start; prints the URL
#   scripts/postgres-lab.sh fresh    as above, with the test database emptied first
#   scripts/postgres-lab.sh stop     stop the cluster
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
  echo "postgres-lab: needs root" >&2
  exit 1
fi

if ! command -v pg_lsclusters >/dev/null || [ -z "$(ls /usr/lib/postgresql 2>/dev/null)" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends postgresql >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq --no-install-recommends postgresql >/dev/null; }
fi

version=$(ls /usr/lib/postgresql | sort -n | tail -1)
if [ -z "$(pg_lsclusters -h | awk -v v="$version" '$1 == v')" ]; then
  pg_createcluster "$version" main >/dev/null
fi
cluster=$(pg_lsclusters -h | awk -v v="$version" '$1 == v {print $2; exit}')
port=$(pg_lsclusters -h | awk -v v="$version" '$1 == v {print $3; exit}')

if [ "${1:-}" = stop ]; then
  pg_ctlcluster "$version" "$cluster" stop >&2 || true
  exit 0
fi

if ! pg_lsclusters -h | awk -v v="$version" -v c="$cluster" '$1 == v && $2 == c' | grep -q online; then
  # To stderr: it may say "Removed stale pid file.", and stdout is the URL alone.
  pg_ctlcluster "$version" "$cluster" start >&2
fi
for _ in $(seq 50); do
  su postgres -c "pg_isready -q -p $port" && break
  sleep 0.2
done

psql_admin() { su postgres -c "psql -p $port -v ON_ERROR_STOP=1 -qtA $*"; }
if [ "${1:-}" = fresh ]; then
  psql_admin "-c 'DROP DATABASE IF EXISTS ceems_test WITH (FORCE)'" >/dev/null
fi
if [ -z "$(psql_admin "-c \"SELECT 1 FROM pg_roles WHERE rolname = 'ceems_test'\"")" ]; then
  psql_admin "-c \"CREATE ROLE ceems_test LOGIN PASSWORD 'ceems_test'\"" >/dev/null
fi
if [ -z "$(psql_admin "-c \"SELECT 1 FROM pg_database WHERE datname = 'ceems_test'\"")" ]; then
  psql_admin "-c 'CREATE DATABASE ceems_test OWNER ceems_test'" >/dev/null
fi
echo "postgres://ceems_test:ceems_test@127.0.0.1:$port/ceems_test"
