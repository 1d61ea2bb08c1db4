#!/usr/bin/env bash
# The stats-server on N generated sacct records (default 1,000,000) of U users (default 1,000):
#   1. ingestion: rows per second (from the sacct run to the last commit), database bytes per
#      job and peak RSS, beside the floor measured in the same run (`scripts/ingest_floor.rs`:
#      the same rows, parsed beforehand, inserted by plain INSERTs with the same schema,
#      indexes and transaction size); then the time of the whole first update (findings,
#      usage);
#   2. the API: GET /api/v1/units as one user (its jobs of the last day) with wrk at C
#      concurrent connections (default 200) for D seconds (default 20), asking for gzip as
#      Grafana does: p50, p99, requests/s,
#      and the server's peak RSS; and, one at a time, the first request of each user, which
#      no cache answers.
# Both on SQLite and on PostgreSQL (Debian's, `scripts/postgres-lab.sh`; as root), one after
# the other in one run; BACKENDS="sqlite" (or "postgres") runs one. Peak RSS is the
# stats-server's own (PostgreSQL's processes aside). Prints figures; asserts nothing.
#   scripts/bench-stats-server.sh [N] [U] [C] [D]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1000000}
users=${2:-1000}
conns=${3:-200}
secs=${4:-20}
command -v wrk >/dev/null || apt-get install -y wrk >/dev/null
cargo build --release --locked -q
cargo build --release --locked -q --example ingest-floor
dir=$(mktemp -d)
chmod 755 "$dir"
pid=
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
now=$(date +%s)
# Jobs of one minute, one starting every second up to now, round-robin over the users.
python3 - "$n" "$users" "$now" "$dir/sacct.txt" <<'PY'
import sys
n, users, now, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
with open(path, "w") as f:
    for i in range(n):
        u = i % users
        s = now - n + i - 60
        f.write(f"{1000+i}|cpu|normal|proj{u % 50}|user{u}|{5000+u}|user{u}|{5000+u}|{s}|{s}|{s+60}|00:01:00|60|0:0|COMPLETED|billing=2,cpu=2,mem=2G,node=1|cn[{i%100:03}-{i%100+1:03}]|/home/user{u}|120|job {i}\n")
PY
printf '#!/bin/sh\nexec /bin/cat %s\n' "$dir/sacct.txt" > "$dir/sacct"
chmod 755 "$dir/sacct" "$dir/sacct.txt"
bench() {
backend=$1
echo "== $backend"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
database=()
if [ "$backend" = postgres ]; then
  pg=$(bash scripts/postgres-lab.sh)
  schema="bench_$$"
  psql "$pg" -qc "DROP SCHEMA IF EXISTS $schema CASCADE; CREATE SCHEMA $schema"
  database=(--storage.database-url="$pg?options[search_path]=$schema")
fi
if [ "$backend" = postgres ]; then
  psql "$pg" -qc "DROP SCHEMA IF EXISTS floor_$$ CASCADE; CREATE SCHEMA floor_$$"
  floor=$(target/release/examples/ingest-floor "$dir/sacct.txt" "$pg?options[search_path]=floor_$$" 2>/dev/null)
  psql "$pg" -qc "DROP SCHEMA floor_$$ CASCADE"
else
  mkdir -p "$dir/floor"
  floor=$(target/release/examples/ingest-floor "$dir/sacct.txt" "$dir/floor/ceems.db" 2>/dev/null)
  rm -rf "$dir/floor"
fi
echo "$floor"
start=$(date +%s.%N)
target/release/ceems stats-server --web.listen-address=127.0.0.1:$port --storage.data.path="$dir/data-$backend" \
  "${database[@]}" \
  --slurm.sacct.path="$dir/sacct" --slurm.sacctmgr.path= --slurm.run-as-user= \
  --storage.first-window=$((n / 86400 + 2))d --storage.update-interval=1h --slurm.cluster-id=bench \
  --security.drop-privileges=false --log.level=warn &
pid=$!
# The database's size: its tables and indexes (PostgreSQL) or its files, WAL included (SQLite).
database_bytes() {
  if [ "$backend" = postgres ]; then
    psql "$pg" -tAc "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace WHERE s.nspname = '$schema' AND c.relkind = 'r'"
  else
    cat "$dir/data-$backend"/ceems.db* | wc -c
  fi
}
rows() {
  curl -sf "127.0.0.1:$port/metrics" 2>/dev/null \
    | awk '/^ceems_stats_ingested_rows_total/ {printf "%d", $2}'
}
until [ "$(rows)" = "$n" ]; do
  sleep 0.2
done
end=$(date +%s.%N)
bytes=$(database_bytes)
rss=$(awk '/VmHWM/ {print $2}' /proc/$pid/status)
floor_rate=$(awk '{print $(NF-1)}' <<<"$floor")
python3 -c "n=$n; t=$end-$start; print(f'ingest: {n} jobs in {t:.1f} s = {n/t:,.0f} rows/s ({$floor_rate/(n/t):.2f}x the floor\'s time); database {$bytes/n:.0f} bytes/job; peak RSS {$rss/1024:.0f} MiB')"
# The rest of the first update (findings of every job, usage) before the API is measured.
updated() {
  curl -sf "127.0.0.1:$port/metrics" 2>/dev/null \
    | awk '/^ceems_stats_last_update_timestamp_seconds/ {printf "%d", $2}'
}
until [ "$(updated)" -gt 0 ] 2>/dev/null; do
  sleep 0.2
done
done_at=$(date +%s.%N)
bytes=$(database_bytes)
python3 -c "print(f'first update (ingest, findings, usage): {$done_at-$start:.1f} s; database {$bytes/$n:.0f} bytes/job with the findings; peak RSS {$(awk '/VmHWM/ {print $2}' /proc/$pid/status)/1024:.0f} MiB')"
# The kernel writes the ingestion's dirty pages back about 30 s later: flush them now, so that
# the API is not measured against that write-back.
sync

url="http://127.0.0.1:$port/api/v1/units"
report() {
  local what=$1 out=$2
  local p50 p99 rps errors
  p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  errors=$(grep -E 'Non-2xx|Socket errors' <<<"$out" || true)
  echo "api ($what): p50 $p50, p99 $p99, $rps req/s${errors:+; $errors}"
}
jobs=$(curl -sf -H 'X-Grafana-User: user7' "$url" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["data"]))')
echo "api: GET /api/v1/units as one user ($jobs jobs of the last day in the answer), $conns connections, ${secs}s each"
# The same question again and again, as dashboards ask it: answered from the cache.
report "same request" "$(wrk -t2 -c"$conns" -d"${secs}s" --latency -H 'X-Grafana-User: user7' -H 'Accept-Encoding: gzip' "$url")"
# Every request a different day, as Grafana's refreshes slide the window: none is answered
# from the cache of requests; the user's jobs and their JSON are reused from the first
# requests. The window keeps its width (one day, as above), so that the answers keep their
# size while it moves a second each request.
cat > "$dir/distinct.lua" <<LUA
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/api/v1/units?from=" .. ($now - 86400 - n) .. "&to=" .. ($now - n))
end
LUA
report "a new window each time" "$(wrk -t2 -c"$conns" -d"${secs}s" --latency -s "$dir/distinct.lua" -H 'X-Grafana-User: user7' -H 'Accept-Encoding: gzip' "$url")"
# Each user's first request reads their jobs and renders them: nothing cached helps.
python3 - "$port" "$users" <<'PY'
import http.client, sys, time
port, users = int(sys.argv[1]), int(sys.argv[2])
conn = http.client.HTTPConnection("127.0.0.1", port)
took = []
for u in range(users):
    if u == 7:
        continue  # asked above
    start = time.perf_counter()
    conn.request("GET", "/api/v1/units", headers={"X-Grafana-User": f"user{u}"})
    body = conn.getresponse().read()
    took.append(time.perf_counter() - start)
    assert b'"status":"success"' in body[:40], body[:200]
took.sort()
print(f"api (first request of each of {len(took)} users, one at a time): "
      f"p50 {took[len(took) // 2] * 1e3:.2f}ms, p99 {took[len(took) * 99 // 100] * 1e3:.2f}ms")
PY
rss=$(awk '/VmHWM/ {print $2}' /proc/$pid/status)
echo "peak RSS of the server: $((rss / 1024)) MiB"
kill "$pid"
wait "$pid" 2>/dev/null || true
pid=
if [ "$backend" = postgres ]; then
  psql "$pg" -qc "DROP SCHEMA $schema CASCADE"
fi
}

for backend in ${BACKENDS:-sqlite postgres}; do
  bench "$backend"
done
