#!/usr/bin/env bash
# Whole-process benchmark of `ceems exporter` with the slurm collector: CPU time per scrape
# (from /proc/<pid>/stat) and RSS, beside four floors measured in the same run on the same
# files (`scripts/read_floor.rs`): naive (open, read, close each file), kept (pread on
# descriptors opened once), both with discovery's directory walk, work (kept, plus parsing
# each file and writing as many series in the text format) and serve (work, served over HTTP
# to the same curl loop and timed as the exporter is: the least any HTTP exporter does).
# - trees: generated v1 and v2 job trees, 0 to 1000 jobs;
# - real: REAL_JOBS (500) real v1 job cgroups with a sleeping process each (root only), on a
#   CPU node and on a GPU node, in one run (ROUNDS rounds too);
# - subs: the perf and eBPF sub-collectors at 10, 100 and 500 real jobs (CPU per scrape and
#   RSS, with and without them), and what they add to a job's own CPU time (a burner that
#   computes and does small file IO, timed with and without them).
# Usage: [ROUNDS=3] [VERBOSE=1] scripts/bench.sh [SCRAPES [PART...]]   (default 30 scrapes,
# parts trees and real; ROUNDS per tree, VERBOSE prints each round's figures).
# Prints tables; asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
scrapes=${1:-30}
shift || true
parts=${*:-trees real}
[[ " $parts " == *" subs "* ]] && [ -x scripts/build-bpf.sh ] && [ "$(id -u)" = 0 ] && ./scripts/build-bpf.sh >/dev/null
cargo build --release --quiet --bin ceems --example gen-job-tree --example read-floor
# A binary just linked is dirty in the page cache, and the exporter cannot then hand its
# start-up pages back (MADV_PAGEOUT skips dirty pages): its RSS read up to 2 MB higher than
# that of an installed binary. Written back first, as a package's would be.
sync
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
max() { echo $(($1 > $2 ? $1 : $2)); }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 100); do curl -sf "127.0.0.1:$1/$2" -o /dev/null && return; sleep 0.05; done; }
# CPU ms per request of the server PID on PORT over N GETs of /metrics, after one to warm up.
ms_per_scrape() {
  local pid=$1 port=$2 n=$3 before after
  curl -sf "127.0.0.1:$port/metrics" -o /dev/null
  before=$(cpu_ticks "$pid")
  for _ in $(seq "$n"); do curl -sf "127.0.0.1:$port/metrics" -o "$work/body"; done
  after=$(cpu_ticks "$pid")
  awk -v d=$((after - before)) -v n="$n" -v t="$tck" 'BEGIN {printf "%.3f", d * 1000 / t / n}'
}
# Appends to the variable named VAR the serve floor's CPU ms per request on these read-floor
# arguments, timed as the exporter is. Run in this shell, so that the exit trap kills it.
add_serve_floor_ms() { # VAR ARGS...
  local var=$1 port ms
  shift
  port=$(free_port)
  "$floor" "$@" serve="127.0.0.1:$port" >/dev/null &
  pid=$!
  wait_http "$port" metrics
  ms=$(ms_per_scrape "$pid" "$port" "$scrapes")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  printf -v "$var" '%s %s' "${!var}" "$ms"
}
# This machine's CPU time per scrape drifts by a tenth from one minute to the next, floors
# included: each figure is measured in ROUNDS rounds, the exporter then the floors, and the
# medians are compared.
rounds=${ROUNDS:-3}
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

if [[ " $parts " == *" trees "* ]]; then
# Each tree's RSS is the highest of its rounds.
echo "trees: $rounds rounds of $scrapes scrapes each; medians of the rounds"
printf '%-4s %6s %8s %14s %9s %8s %8s %9s %9s %8s %8s %9s %12s %8s %8s\n' cg jobs series "cpu_ms/scrape" naive_ms kept_ms work_ms serve_ms now/naive now/kept now/work now/serve idle_rss_MB rss_MB hwm_MB
for version in v1 v2; do
  for jobs in 0 10 100 1000; do
    tree="$work/$version-$jobs"
    "$gen" "$tree" "$jobs" "$version" >/dev/null
    cpus="" naives="" kepts="" leasts="" serves="" idle=0 rss=0 hwm=0
    for _ in $(seq "$rounds"); do
      port=$(free_port)
      "$bin" exporter --collector.slurm --collector.slurm.swap-memory-metrics --collector.slurm.psi-metrics \
        --collector.cgroups.force-version="$version" \
        --path.cgroupfs="$tree/sys/fs/cgroup" --path.procfs="$tree/proc" --path.sysfs="$tree/sys" \
        --web.listen-address="127.0.0.1:$port" --log.level=warn &
      pid=$!
      wait_http "$port" health
      sleep 0.3
      idle=$(max "$(rss_kib "$pid")" "$idle")
      cpus="$cpus $(ms_per_scrape "$pid" "$port" "$scrapes")"
      rss=$(max "$(rss_kib "$pid")" "$rss") hwm=$(max "$(hwm_kib "$pid")" "$hwm")
      series=$(grep -vc '^#' "$work/body" || true)
      kill "$pid"; wait "$pid" 2>/dev/null || true
      read -r naive kept _ _ least < <("$floor" "$tree/sys/fs/cgroup" "$version" "$scrapes" swap psi)
      naives="$naives $naive" kepts="$kepts $kept" leasts="$leasts $least"
      add_serve_floor_ms serves "$tree/sys/fs/cgroup" "$version" "$scrapes" swap psi
    done
    cpu_ms=$(echo "$cpus" | median) naive=$(echo "$naives" | median) kept=$(echo "$kepts" | median)
    least=$(echo "$leasts" | median) serve=$(echo "$serves" | median)
    ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "-"}'; }
    printf '%-4s %6d %8d %14.2f %9.2f %8.2f %8.2f %9.2f %9s %8s %8s %9s %12.1f %8.1f %8.1f\n' "$version" "$jobs" "$series" "$cpu_ms" \
      "$naive" "$kept" "$least" "$serve" "$(ratio "$cpu_ms" "$naive")" "$(ratio "$cpu_ms" "$kept")" "$(ratio "$cpu_ms" "$least")" \
      "$(ratio "$cpu_ms" "$serve")" "$(echo "$idle/1024" | bc -l)" "$(echo "$rss/1024" | bc -l)" "$(echo "$hwm/1024" | bc -l)"
    if [ -n "${VERBOSE:-}" ]; then echo "  rounds: exporter [$cpus ] naive [$naives ] kept [$kepts ] work [$leasts ] serve [$serves ]"; fi
  done
done
fi
[[ " $parts " == *" real "* || " $parts " == *" subs "* ]] || exit 0

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
make_jobs() {
for i in $(seq "$1" "$2"); do
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
}
[[ " $parts " == *" real "* ]] && make_jobs 1 "$real_jobs"
sleep 1
smi="$work/nvidia-smi"
cp tests/fixtures/compat/fixtures/nvidia-smi/nvidia-smi_--query_--xml-format.xml "$work/smi.xml"
printf '#!/bin/sh\nexec cat %q\n' "$work/smi.xml" >"$smi"
chmod 755 "$smi"
chmod 644 "$work/smi.xml"

# CPU per scrape of an exporter started with these flags on the real hierarchy.
measure_real() {
  local port
  port=$(free_port)
  "$bin" exporter --collector.slurm --web.disable-exporter-metrics --collector.disable-defaults \
    --web.listen-address="127.0.0.1:$port" --log.level=error "$@" &
  pid=$!
  wait_http "$port" health
  ms_per_scrape "$pid" "$port" "${n_scrapes:-$scrapes}"
  rss_kib "$pid" >"$work/rss"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

if [[ " $parts " == *" real "* ]]; then
echo
echo "real v1 jobs: $real_jobs, CPU-only (SLURM_JOB_ID, no GPU variable), $scrapes scrapes each; medians of $rounds rounds"
nogpus="" nvidias="" naives="" kepts="" leasts="" serves=""
for _ in $(seq "$rounds"); do
  nogpus="$nogpus $(measure_real --collector.gpu.type=nogpu)"
  units_nogpu=$(awk '/^ceems_compute_units\{/ {print $2}' "$work/body")
  nvidias="$nvidias $(measure_real --collector.gpu.type=nvidia --collector.gpu.nvidia-smi-path="$smi")"
  units_nvidia=$(awk '/^ceems_compute_units\{/ {print $2}' "$work/body")
  read -r naive kept floor_jobs _ least < <("$floor" "$cg" v1 "$scrapes")
  naives="$naives $naive" kepts="$kepts $kept" leasts="$leasts $least"
  add_serve_floor_ms serves "$cg" v1 "$scrapes"
done
nogpu=$(echo "$nogpus" | median) nvidia=$(echo "$nvidias" | median)
naive=$(echo "$naives" | median) kept=$(echo "$kepts" | median) least=$(echo "$leasts" | median)
serve=$(echo "$serves" | median)
if [ -n "${VERBOSE:-}" ]; then
  echo "  rounds: CPU node [$nogpus ] GPU node [$nvidias ] naive [$naives ] kept [$kepts ] work [$leasts ] serve [$serves ]"
fi
printf '%-44s %14s %8s\n' node cpu_ms/scrape jobs
printf '%-44s %14s %8s\n' "CPU node (--collector.gpu.type=nogpu)" "$nogpu" "$units_nogpu"
printf '%-44s %14s %8s\n' "GPU node (nvidia, nvidia-smi stand-in)" "$nvidia" "$units_nvidia"
printf '%-44s %14s %8s\n' "naive floor (open, read, close)" "$naive" "$floor_jobs"
printf '%-44s %14s %8s\n' "kept floor (pread on open descriptors)" "$kept" "$floor_jobs"
printf '%-44s %14s %8s\n' "work floor (kept, parsed, series written)" "$least" "$floor_jobs"
printf '%-44s %14s %8s\n' "serve floor (work, served over HTTP)" "$serve" "$floor_jobs"
awk -v a="$nvidia" -v b="$nogpu" 'BEGIN {printf "GPU node / CPU node: %.2fx\n", a / b}'
awk -v a="$nogpu" -v b="$naive" -v k="$kept" \
  'BEGIN {printf "CPU node / naive floor: %.2fx; kept floor / naive floor: %.2fx\n", a / b, k / b}'
awk -v a="$nogpu" -v k="$kept" -v w="$least" -v s="$serve" \
  'BEGIN {printf "CPU node / kept floor: %.2fx; / work floor: %.2fx; / serve floor: %.2fx\n", a / k, a / w, a / s}'
fi
[[ " $parts " == *" subs "* ]] || exit 0

# The sub-collectors: software perf events (hardware ones too where the CPU has them) and both
# eBPF groups, on the same real jobs, against the slurm collector alone.
# SUBS and SUB_JOBS narrow it down (one sub-collector, one job count).
read -r -a subs <<<"${SUBS:---collector.perf.hardware-events --collector.perf.software-events --collector.ebpf.io-metrics --collector.ebpf.network-metrics}"
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || true
echo
# CPU time is counted in clock ticks (10 ms): fewer jobs get more scrapes, SCRAPES x 500 / jobs.
echo "perf and eBPF sub-collectors on real v1 jobs, $scrapes x 500 / jobs scrapes each"
printf '%6s %14s %14s %16s %10s %10s\n' jobs base_ms/scrape subs_ms/scrape added_ms/100jobs base_rss_MB subs_rss_MB
made=0
for n in ${SUB_JOBS:-10 100 500}; do
  make_jobs $((made + 1)) "$n"
  made=$n
  sleep 1
  n_scrapes=$((scrapes * 500 / n))
  base=$(measure_real --collector.gpu.type=nogpu); base_rss=$(cat "$work/rss")
  with=$(measure_real --collector.gpu.type=nogpu "${subs[@]}"); with_rss=$(cat "$work/rss")
  unset n_scrapes
  printf '%6d %14s %14s %16s %10.1f %10.1f\n' "$n" "$base" "$with" \
    "$(awk -v a="$with" -v b="$base" -v n="$n" 'BEGIN {printf "%.2f", (a - b) * 100 / n}')" \
    "$(echo "$base_rss/1024" | bc -l)" "$(echo "$with_rss/1024" | bc -l)"
done

# A job's own cost: a burner computes and writes/reads a 4 KiB block every EVERY iterations
# (1000: a compute job; 20: a job made of small IO system calls). Each run is a new job (its
# own cgroup, as Slurm makes one per job) whose burner waits until an exporter with the
# sub-collectors has scraped once, so that perf counts it in task mode too. Its time is its
# own CPU time (user and system, where the eBPF programs run), not the wall clock, so that the
# exporter's scrapes taking a core of this small machine do not count as the job's slowdown
# (they are the CPU per scrape above). ROUNDS rounds (default 9) alternate runs without an
# exporter and with one (scraped each second meanwhile); the medians are compared, so drift
# in the machine's speed hits both alike.
rounds=${ROUNDS:-9}
burn_id=899000
burn() { # ITERATIONS EVERY COUNTED
  burn_id=$((burn_id + 1))
  local rel="slurm_bench/uid_0/job_$burn_id/step_batch/task_0" go="$work/go" burner
  mkdir -p "$cg/cpuacct/$rel" "$cg/memory/$rel"
  rm -f "$go" "$work/took"
  sh -c "echo \$\$ > $cg/cpuacct/$rel/cgroup.procs && echo \$\$ > $cg/memory/$rel/cgroup.procs && exec python3 -c '
import os, time
while not os.path.exists(\"$go\"): time.sleep(0.005)
t = time.process_time(); fd = os.open(\"$work/burn\", os.O_RDWR | os.O_CREAT)
x = 0
for i in range($1):
    x += i * i % 7
    if i % $2 == 0:
        os.pwrite(fd, b\"x\" * 4096, 0); os.pread(fd, 4096, 0)
print(time.process_time() - t)'" >"$work/took" &
  burner=$!
  sleep 0.1
  [ "$3" = 1 ] && curl -sf "127.0.0.1:$port/metrics" -o /dev/null
  touch "$go"
  wait "$burner"
  cat "$work/took"
}
port=$(free_port)
: >"$work/times"
for _ in $(seq "$rounds"); do
  echo "alone cpu $(burn 2000000 1000 0)" >>"$work/times"
  echo "alone io $(burn 200000 20 0)" >>"$work/times"
  "$bin" exporter --collector.slurm --collector.disable-defaults --collector.gpu.type=nogpu "${subs[@]}" \
    --web.listen-address="127.0.0.1:$port" --log.level=error &
  pid=$!
  wait_http "$port" health
  ( while kill -0 "$pid" 2>/dev/null; do curl -sf "127.0.0.1:$port/metrics" -o /dev/null; sleep 1; done ) &
  scraper=$!
  echo "counted cpu $(burn 2000000 1000 1)" >>"$work/times"
  echo "counted io $(burn 200000 20 1)" >>"$work/times"
  kill "$pid" "$scraper" 2>/dev/null; wait "$pid" "$scraper" 2>/dev/null || true
done
echo
for kind in cpu io; do
  alone=$(awk -v k="$kind" '$1 == "alone" && $2 == k {print $3}' "$work/times" | median)
  counted=$(awk -v k="$kind" '$1 == "counted" && $2 == k {print $3}' "$work/times" | median)
  printf '%s burner, median of %d: alone %.4f s, counted by the sub-collectors %.4f s: %+.2f%%\n' \
    "$kind" "$rounds" "$alone" "$counted" "$(awk -v a="$alone" -v b="$counted" 'BEGIN {print (b - a) * 100 / a}')"
done
