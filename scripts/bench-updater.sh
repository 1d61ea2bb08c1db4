#!/usr/bin/env bash
# The stats-server's updater against a real TSDB: Debian's VictoriaMetrics loaded through its
# import API with a day of JOBS jobs on NODES nodes (default 100,000 on 1,000; `gen-day-of-jobs`:
# their series as the exporter and the recording rules give them, every 30 s over each job's
# life, most jobs short and a long tail), the matching sacct lines, then the stats-server's
# first update and the next one. Prints, for each update: wall time, queries sent, samples the
# store read per job and its CPU seconds per 1,000 jobs (from VictoriaMetrics's own /metrics);
# the server's peak RSS; GET /api/v1/units p50/p99 at CONNS connections (default 200) while
# the first update runs, uncompressed and gzip-compressed; beside them the floor (one PromQL
# query per aggregate over all the jobs, timed in the same run); and, on a sample of SAMPLE
# jobs (default 50), the largest gap between a job's CPU time and energy and what PromQL gives
# for that job alone. Asserts nothing. Needs root to install what is missing.
#   scripts/bench-updater.sh [JOBS] [NODES] [CONNS] [SAMPLE]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${1:-100000}
nodes=${2:-1000}
conns=${3:-200}
sample=${4:-50}
command -v victoria-metrics >/dev/null || apt-get install -y victoria-metrics >/dev/null
command -v wrk >/dev/null || apt-get install -y wrk >/dev/null
cargo build --release --locked -q --bin ceems --example gen-day-of-jobs
dir=$(mktemp -d)
chmod 755 "$dir"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now=$(date +%s)

vm_port=$(free_port)
vm="http://127.0.0.1:$vm_port"
# Series limits raised for the floor's all-jobs queries; the updater's batches stay far below.
victoria-metrics -storageDataPath="$dir/vm" -httpListenAddr="127.0.0.1:$vm_port" \
  -retentionPeriod=3d -search.maxUniqueTimeseries=5000000 -loggerLevel=ERROR >/dev/null 2>&1 &
vm_pid=$!
pids+=("$vm_pid")
until curl -sf "$vm/health" >/dev/null; do sleep 0.2; done
start=$(date +%s.%N)
target/release/examples/gen-day-of-jobs "$jobs" "$nodes" "$now" "$dir" \
  | curl -sf -X POST -T - "$vm/api/v1/import"
curl -sf "$vm/internal/force_flush" >/dev/null
python3 -c "print(f'import: {$(date +%s.%N)-$start:.1f} s into VictoriaMetrics')"
printf '#!/bin/sh\nexec /bin/cat %s\n' "$dir/sacct.txt" >"$dir/sacct"
chmod 755 "$dir/sacct" "$dir/sacct.txt"

# A metric of VictoriaMetrics's own (summed over its series).
# VictoriaMetrics refreshes its own metrics about every second: read them 2 s after the fact.
vm_metric() { sleep 2; curl -sf "$vm/metrics" | awk -v n="$1" '$1 == n || index($1, n "{") == 1 {s += $2} END {printf "%.3f", s}'; }
# Waits are cut short when a stats-server has stopped (its log says why).
alive() { kill -0 "$pid" 2>/dev/null || { echo "the stats-server stopped" >&2; exit 1; }; }
# Starts a stats-server on a fresh database (`$1`) and waits until it has ingested every job.
start_server() {
  port=$(free_port)
  server="http://127.0.0.1:$port"
  target/release/ceems stats-server --web.listen-address="127.0.0.1:$port" \
    --storage.data.path="$dir/$1" --slurm.sacct.path="$dir/sacct" --slurm.sacctmgr.path= \
    --slurm.run-as-user= --slurm.cluster-id=bench --storage.first-window=2d \
    --storage.update-interval=60s --prometheus.url="$vm" --prometheus.scrape-interval=30s \
    --prometheus.query-delay=1m --web.admin-users=root --security.drop-privileges=false \
    --log.level="${BENCH_LOG_LEVEL:-warn}" ${BENCH_SERVER_FLAGS:-} &
  pid=$!
  pids+=("$pid")
  until [ "$(metric ceems_stats_ingested_rows_total)" = "$jobs.000" ]; do alive; sleep 0.2; done
}
metric() { curl -sf "$server/metrics" 2>/dev/null | awk -v n="$1" 'index($1, n "{") == 1 {s += $2} END {printf "%.3f", s}'; }
updated() { until [ "$(metric ceems_stats_last_update_timestamp_seconds)" != "$1" ]; do alive; sleep 0.2; done; }

# Server A, alone on the machine with the store: the first update, then the next one.
read0=$(vm_metric vm_rows_read_per_query_sum)
cpu0=$(vm_metric process_cpu_seconds_total)
start_server a
updated 0.000
first=$(metric ceems_stats_last_aggregate_duration_seconds)
queries1=$(metric ceems_stats_aggregate_queries_total)
read1=$(vm_metric vm_rows_read_per_query_sum)
cpu1=$(vm_metric process_cpu_seconds_total)
python3 - "$jobs" "$first" "$queries1" "$read0" "$read1" "$cpu0" "$cpu1" <<'PY'
import sys
jobs, first, q, r0, r1, c0, c1 = map(float, sys.argv[1:])
print(f"first update: {first:.1f} s, {q:.0f} queries, {(r1 - r0) / jobs:.0f} samples read per job, "
      f"store CPU {(c1 - c0) / jobs * 1000:.2f} s per 1,000 jobs")
PY
updated "$(metric ceems_stats_last_update_timestamp_seconds)"
second=$(metric ceems_stats_last_aggregate_duration_seconds)
queries2=$(metric ceems_stats_aggregate_queries_total)
read2=$(vm_metric vm_rows_read_per_query_sum)
cpu2=$(vm_metric process_cpu_seconds_total)
running=$(grep -c '|RUNNING|' "$dir/sacct.txt" || true)
python3 - "$running" "$second" "$queries1" "$queries2" "$read1" "$read2" "$cpu1" "$cpu2" <<'PY'
import sys
running, t, q1, q2, r1, r2, c1, c2 = map(float, sys.argv[1:])
print(f"next update, a minute later ({running:.0f} jobs running): {t:.1f} s, {q2 - q1:.0f} queries, "
      f"{r2 - r1:.0f} samples read, store CPU {c2 - c1:.2f} s")
PY
rss=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
echo "peak RSS of the stats-server: $((rss / 1024)) MiB"
server_a=$server

# Servers B and C, each on a fresh database: GET /units at CONNS connections while its first
# update runs, as curl asks (no compression), then as Grafana asks (gzip).
for encoding in identity gzip; do
  start_server "b-$encoding"
  wrk_out=$(wrk -t2 -c"$conns" -d10s --latency -H "Accept-Encoding: $encoding" \
    -H 'X-Grafana-User: user7' "$server/api/v1/units")
  updated 0.000
  echo "GET /api/v1/units as one user ($encoding) during a first update ($(metric ceems_stats_last_aggregate_duration_seconds | cut -d. -f1) s under this load), $conns connections, 10 s: p50 $(awk '$1 == "50%" {print $2}' <<<"$wrk_out"), p99 $(awk '$1 == "99%" {print $2}' <<<"$wrk_out"), $(awk '/Requests\/sec/ {print $2}' <<<"$wrk_out") requests/s"
  kill "$pid"
done
server=$server_a

# The floor: each default aggregate asked once for every job of the day, and the sample.
python3 - "$vm" "$server" "$now" "$jobs" "$sample" "$dir/sacct.txt" <<'PY'
import json, sys, time, urllib.parse, urllib.request
vm, server, now, jobs, sample, sacct = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
at = now - 60
rng = f"{86400 + 600}s"
def query(q, t=at):
    body = urllib.parse.urlencode({"query": q, "time": t}).encode()
    with urllib.request.urlopen(f"{vm}/api/v1/query", body, timeout=600) as r:
        return json.load(r)["data"]["result"]
def metric(name):
    with urllib.request.urlopen(f"{vm}/metrics") as r:
        return sum(float(l.split()[-1]) for l in r.read().decode().splitlines()
                   if l.startswith(name + " ") or l.startswith(name + "{"))
sel = lambda n: f'{n}{{uuid=~".+"}}'
floor = [
    f"sum by (uuid) (increase({sel('ceems_compute_unit_cpu_user_seconds_total')}[{rng}]) + increase({sel('ceems_compute_unit_cpu_system_seconds_total')}[{rng}]))",
    f"sum by (uuid) (avg_over_time({sel('uuid:ceems_cpu_power_watts:pue')}[{rng}]))",
    f"sum by (uuid) (avg_over_time({sel('uuid:ceems_host_power_watts:pue')}[{rng}]))",
    f"sum by (uuid) (increase({sel('ceems_compute_unit_gpu_energy_joules_total')}[{rng}]))",
    f"sum by (uuid) (avg_over_time({sel('uuid:ceems_host_emissions_g_s:pue')}[{rng}]))",
    f"sum by (uuid) (avg_over_time({sel('ceems_compute_unit_memory_used_bytes')}[{rng}]))",
    f"avg by (uuid) (avg_over_time({sel('ceems_compute_unit_gpu_utilization_ratio')}[{rng}]))",
    f"sum by (uuid) (increase({sel('ceems_compute_unit_blkio_read_bytes_total')}[{rng}]))",
    f"sum by (uuid) (increase({sel('ceems_compute_unit_blkio_write_bytes_total')}[{rng}]))",
    f"max by (uuid) (max_over_time({sel('ceems_compute_unit_memory_used_bytes')}[{rng}]))",
    f"max by (uuid) (max_over_time({sel('ceems_compute_unit_memory_fail_count')}[{rng}]))",
    f"max by (uuid) (max_over_time({sel('ceems_compute_unit_gpu_utilization_ratio')}[{rng}]))",
]
r0, c0 = metric("vm_rows_read_per_query_sum"), metric("process_cpu_seconds_total")
start = time.perf_counter()
answered = [len(query(q)) for q in floor]
took = time.perf_counter() - start
time.sleep(2)  # VictoriaMetrics refreshes its own metrics about every second
r1, c1 = metric("vm_rows_read_per_query_sum"), metric("process_cpu_seconds_total")
print(f"floor: {took:.1f} s for {len(floor)} queries over all {answered[0]} jobs, "
      f"{(r1 - r0) / jobs:.0f} samples read per job, store CPU {(c1 - c0) / jobs * 1000:.2f} s per 1,000 jobs")

# A sample of finished jobs: the server's totals against PromQL for each job alone.
done = [f for f in (l.split("|") for l in open(sacct)) if f[14] == "COMPLETED" and int(f[10]) < now - 300]
picked = done[:: max(1, len(done) // sample)][:sample]
worst, compared = 0.0, 0
for f in picked:
    uuid, start_t, end_t = f[0], int(f[9]), int(f[10])
    req = urllib.request.Request(
        f"{server}/api/v1/units/admin?from=0&uuid={uuid}&field=total_cpu_seconds&field=total_host_energy_usage_kwh",
        headers={"X-Grafana-User": "root"})
    try:
        unit = json.load(urllib.request.urlopen(req))["data"][0]
    except Exception as e:
        print(f"sample: job {uuid} not answered: {e}")
        continue
    s = lambda n: f'{n}{{uuid="{uuid}"}}'
    cpu = query(f"sum(increase({s('ceems_compute_unit_cpu_user_seconds_total')}[{rng}]) + increase({s('ceems_compute_unit_cpu_system_seconds_total')}[{rng}]))")
    watts = query(f"avg_over_time({s('uuid:ceems_host_power_watts:pue')}[{rng}])")
    want_cpu = float(cpu[0]["value"][1]) if cpu else 0.0
    want_kwh = (float(watts[0]["value"][1]) if watts else 0.0) * (end_t - start_t) / 3.6e6
    compared += 1
    for got, want in ((unit.get("total_cpu_seconds", 0.0), want_cpu), (unit.get("total_host_energy_usage_kwh", 0.0), want_kwh)):
        gap = abs(got - want) / max(abs(want), 1e-9)
        worst = max(worst, gap if abs(got - want) > 1e-8 else 0.0)
print(f"sample of {compared} finished jobs: largest gap to their one-job PromQL {worst * 100:.4f} %")
PY
