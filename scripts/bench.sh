#!/usr/bin/env bash
# Whole-process benchmark of `ceems exporter` with the slurm collector: CPU time per scrape
# (from /proc/<pid>/stat) and RSS, beside two floors measured in the same run on the same files
# (`scripts/read_floor.rs`): naive (open, read, close each file) and kept (pread on descriptors
# opened once), both with discovery's directory walk.
# - trees: generated v1 and v2 job trees, 0 to 1000 jobs;
# - real: REAL_JOBS (500) real v1 job cgroups with a sleeping process each (root only), on a
#   CPU node and on a GPU node, in one run.
# Usage: scripts/bench.sh [SCRAPES [PART...]]   (default 30 scrapes, both parts). Prints
# tables; asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
scrapes=${1:-30}
shift || true
parts=${*:-trees real}
cargo build --release --quiet --bin ceems --example gen-job-tree --example read-floor
bin=${CEEMS_BIN:-target/release/ceems}
gen=target/release/examples/gen-job-tree
floor=target/release/examples/read-floor
tck=$(getconf CLK_TCK)
work=$(mktemp -d)
# Started as root, the exporter drops to nobody: the trees must be theirs to read.
chmod 755 "$work"
trap 'kill "${pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
hwm_kib() { awk '/^VmHWM/ {print $2}' "/proc/$1/status"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

if [[ " $parts " == *" trees "* ]]; then
printf '%-4s %6s %8s %14s %9s %8s %10s %12s %8s %8s\n' cg jobs series "cpu_ms/scrape" naive_ms kept_ms now/naive idle_rss_MB rss_MB hwm_MB
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
    rss=$(rss_kib "$pid") hwm=$(hwm_kib "$pid")
    kill "$pid"; wait "$pid" 2>/dev/null || true
    read -r naive kept _ < <("$floor" "$tree/sys/fs/cgroup" "$version" "$scrapes" swap psi)
    printf '%-4s %6d %8d %14s %9s %8s %10s %12.1f %8.1f %8.1f\n' "$version" "$jobs" "$series" "$cpu_ms" \
      "$naive" "$kept" "$(awk -v a="$cpu_ms" -v b="$naive" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "-"}')" \
      "$(echo "$idle/1024" | bc -l)" "$(echo "$rss/1024" | bc -l)" "$(echo "$hwm/1024" | bc -l)"
  done
done
fi
[[ " $parts " == *" real "* ]] || exit 0

# Real v1 jobs: as root on writable cgroup v1 hierarchies, N Slurm-shaped job cgroups
# (slurm_bench/uid_0/job_<id>/step_batch/task_0) with one sleeping process each, whose
# environment has SLURM_JOB_ID and no GPU variable. The exporter runs as it does in
# production: started as root, it drops to nobody and raises a capability to read environs.
real_jobs=${REAL_JOBS:-500}
cg=/sys/fs/cgroup
if [ "$(id -u)" != 0 ] || [ ! -w "$cg/memory" ] || [ ! -f "$cg/cpuacct/cpuacct.usage" ]; then
  echo "real v1 jobs: skipped (needs root and writable cgroup v1 cpuacct and memory hierarchies)"
  exit 0
fi
sleepers=()
cleanup_real() {
  kill "${sleepers[@]}" 2>/dev/null || true
  wait "${sleepers[@]}" 2>/dev/null || true
  for c in cpuacct memory cpuset; do
    [ -d "$cg/$c/slurm_bench" ] || continue
    # Deepest first; the kernel releases killed tasks after a moment.
    for _ in 1 2 3 4 5; do
      find "$cg/$c/slurm_bench" -depth -type d -exec rmdir {} + 2>/dev/null || true
      [ -d "$cg/$c/slurm_bench" ] || break
      sleep 0.2
    done
  done
}
trap 'kill "${pid:-}" 2>/dev/null || true; cleanup_real; rm -rf "$work"' EXIT
cleanup_real
for i in $(seq "$real_jobs"); do
  id=$((800000 + i))
  rel="slurm_bench/uid_0/job_$id/step_batch"
  mkdir -p "$cg/cpuacct/$rel/task_0" "$cg/memory/$rel/task_0"
  if [ -f "$cg/cpuset/cpuset.cpus" ]; then
    for d in slurm_bench slurm_bench/uid_0 "slurm_bench/uid_0/job_$id" "$rel"; do
      if [ ! -d "$cg/cpuset/$d" ]; then
        mkdir "$cg/cpuset/$d"
        cat "$(dirname "$cg/cpuset/$d")/cpuset.cpus" >"$cg/cpuset/$d/cpuset.cpus"
        cat "$(dirname "$cg/cpuset/$d")/cpuset.mems" >"$cg/cpuset/$d/cpuset.mems"
      fi
    done
  fi
  join="echo \$\$ > $cg/cpuacct/$rel/task_0/cgroup.procs && echo \$\$ > $cg/memory/$rel/task_0/cgroup.procs"
  [ -d "$cg/cpuset/$rel" ] && join="$join && echo \$\$ > $cg/cpuset/$rel/cgroup.procs"
  env -i PATH=/usr/bin:/bin SLURM_JOB_ID="$id" SLURM_JOB_USER=root sh -c "$join && exec sleep 3600" &
  sleepers+=($!)
done
sleep 1
smi="$work/nvidia-smi"
cp tests/fixtures/compat/fixtures/nvidia-smi/nvidia-smi_--query_--xml-format.xml "$work/smi.xml"
printf '#!/bin/sh\nexec cat %q\n' "$work/smi.xml" >"$smi"
chmod 755 "$smi"
chmod 644 "$work/smi.xml"

# CPU per scrape of an exporter started with these flags on the real hierarchy.
measure_real() {
  local port before after
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$bin" exporter --collector.slurm --web.disable-exporter-metrics --collector.disable-defaults \
    --web.listen-address="127.0.0.1:$port" --log.level=error "$@" &
  pid=$!
  for _ in $(seq 100); do curl -sf "127.0.0.1:$port/health" >/dev/null && break; sleep 0.05; done
  curl -sf "127.0.0.1:$port/metrics" -o "$work/body"   # warm up
  before=$(cpu_ticks "$pid")
  for _ in $(seq "$scrapes"); do curl -sf "127.0.0.1:$port/metrics" -o "$work/body"; done
  after=$(cpu_ticks "$pid")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  awk -v d=$((after - before)) -v n="$scrapes" -v t="$tck" 'BEGIN {printf "%.2f", d * 1000 / t / n}'
}

echo
echo "real v1 jobs: $real_jobs, CPU-only (SLURM_JOB_ID, no GPU variable), $scrapes scrapes each"
nogpu=$(measure_real --collector.gpu.type=nogpu)
units_nogpu=$(awk '/^ceems_compute_units\{/ {print $2}' "$work/body")
nvidia=$(measure_real --collector.gpu.type=nvidia --collector.gpu.nvidia-smi-path="$smi")
units_nvidia=$(awk '/^ceems_compute_units\{/ {print $2}' "$work/body")
read -r naive kept floor_jobs _ < <("$floor" "$cg" v1 "$scrapes")
printf '%-44s %14s %8s\n' node cpu_ms/scrape jobs
printf '%-44s %14s %8s\n' "CPU node (--collector.gpu.type=nogpu)" "$nogpu" "$units_nogpu"
printf '%-44s %14s %8s\n' "GPU node (nvidia, nvidia-smi stand-in)" "$nvidia" "$units_nvidia"
printf '%-44s %14s %8s\n' "naive floor (open, read, close)" "$naive" "$floor_jobs"
printf '%-44s %14s %8s\n' "kept floor (pread on open descriptors)" "$kept" "$floor_jobs"
awk -v a="$nvidia" -v b="$nogpu" 'BEGIN {printf "GPU node / CPU node: %.2fx\n", a / b}'
awk -v a="$nogpu" -v b="$naive" -v k="$kept" \
  'BEGIN {printf "CPU node / naive floor: %.2fx; kept floor / naive floor: %.2fx\n", a / b, k / b}'
