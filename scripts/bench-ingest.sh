#!/usr/bin/env bash
# Ingests N generated sacct records (default 1,000,000) with the release stats-server and prints
# rows per second (from the sacct run to the last commit) and database bytes per job.
#   scripts/bench-ingest.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1000000}
cargo build --release --locked -q
dir=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
python3 - "$n" "$dir/sacct.txt" <<'PY'
import sys
n, path = int(sys.argv[1]), sys.argv[2]
with open(path, "w") as f:
    for i in range(n):
        u, uid, a = ("alice", 2001, "physics") if i % 3 == 0 else ("bob", 2002, "chemistry")
        s = 1795000000 + i
        f.write(f"{1000+i}|debug|normal|{a}|{u}|{uid}|{u}|{uid}|{s}|{s}|{s+60}|00:01:00|60|0:0|COMPLETED|billing=1,cpu=2,mem=2G,node=1|cn[{i%100:03}-{i%100+1:03}]|/home/{u}|job {i}\n")
PY
printf '#!/bin/sh\nexec /bin/cat %s\n' "$dir/sacct.txt" > "$dir/sacct"
chmod 755 "$dir/sacct"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
start=$(date +%s.%N)
target/release/ceems stats-server --web.listen-address=127.0.0.1:$port --storage.data.path="$dir/data" \
  --slurm.sacct.path="$dir/sacct" --storage.update-interval=1h --slurm.cluster-id=bench \
  --security.drop-privileges=false --log.level=warn &
pid=$!
rows() {
  curl -sf "127.0.0.1:$port/metrics" 2>/dev/null \
    | awk '/^ceems_stats_ingested_rows_total/ {printf "%d", $2}'
}
until [ "$(rows)" = "$n" ]; do
  sleep 0.2
done
end=$(date +%s.%N)
bytes=$(cat "$dir"/data/ceems.db* | wc -c)
rss=$(awk '/VmHWM/ {print $2}' /proc/$pid/status)
python3 -c "n=$n; t=$end-$start; print(f'ingest: {n} jobs in {t:.1f} s = {n/t:,.0f} rows/s; database {$bytes/n:.0f} bytes/job; peak RSS {$rss/1024:.0f} MiB')"
