#!/usr/bin/env bash
# Whole-process benchmark of `ceems exporter` with the slurm collector on generated job trees:
# CPU time per scrape (from /proc/<pid>/stat), RSS when idle and after scrapes.
# Usage: scripts/bench.sh [SCRAPES]   (default 30). Prints one table; asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
scrapes=${1:-30}
cargo build --release --quiet --bin ceems --example gen-job-tree
bin=target/release/ceems
gen=target/release/examples/gen-job-tree
tck=$(getconf CLK_TCK)
work=$(mktemp -d)
trap 'kill "${pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
hwm_kib() { awk '/^VmHWM/ {print $2}' "/proc/$1/status"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

printf '%-4s %6s %10s %14s %12s %12s %10s\n' cg jobs series "cpu_ms/scrape" idle_rss_MB rss_MB hwm_MB
for version in v1 v2; do
  for jobs in 0 10 100 1000; do
    tree="$work/$version-$jobs"
    "$gen" "$tree" "$jobs" "$version" >/dev/null
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$bin" exporter --collector.slurm --collector.slurm.swap-memory-metrics --collector.slurm.psi-metrics \
      --collector.cgroups.force-version="$version" \
      --path.cgroupfs="$tree/sys/fs/cgroup" --path.procfs="$tree/proc" --path.sysfs="$tree/sys" \
      --web.listen-address="127.0.0.1:$port" --log.level=warn &
    pid=$!
    for _ in $(seq 100); do curl -sf "127.0.0.1:$port/health" >/dev/null && break; sleep 0.05; done
    sleep 0.3
    idle=$(rss_kib "$pid")
    curl -sf "127.0.0.1:$port/metrics" >/dev/null   # warm up
    before=$(cpu_ticks "$pid")
    for _ in $(seq "$scrapes"); do curl -sf "127.0.0.1:$port/metrics" -o "$work/body"; done
    after=$(cpu_ticks "$pid")
    series=$(grep -vc '^#' "$work/body")
    cpu_ms=$(awk -v d=$((after - before)) -v n="$scrapes" -v t="$tck" 'BEGIN {printf "%.2f", d * 1000 / t / n}')
    printf '%-4s %6d %10d %14s %12.1f %12.1f %10.1f\n' "$version" "$jobs" "$series" "$cpu_ms" \
      "$(echo "$idle/1024" | bc -l)" "$(echo "$(rss_kib "$pid")/1024" | bc -l)" "$(echo "$(hwm_kib "$pid")/1024" | bc -l)"
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
done
