#!/usr/bin/env bash
# The GPU check on a real NVIDIA node with cgroup v2 and NVML (the device machine), as root.
# Build the release binary first where cargo is (`cargo build --release`) and carry
# target/release/ceems over; this script needs only python3 with PyTorch and nvidia-smi.
#
# It makes a cgroup shaped like a Slurm v2 job (system.slice/slurmstepd.scope/job_4242), runs
# a PyTorch matmul loop in it with SLURM_JOB_ID=4242 and SLURM_JOB_GPUS=0, starts the
# exporter, scrapes twice and checks:
#   - the per-GPU energy counter of GPU 0 increases;
#   - its power is within 10% of `nvidia-smi --query-gpu=power.draw`;
#   - job 4242 is mapped to GPU 0 (ceems_compute_unit_gpu_index_flag = 1);
#   - the job's GPU energy counter increases.
# Then the same for an OpenPBS job on v2 (pbs_jobs.service/jobid/4243.gpucheck, as PBS's
# pbs_cgroups hook makes it, with PBS_JOBID and CUDA_VISIBLE_DEVICES=<GPU 0's UUID>): the
# exporter's openpbs collector maps it to GPU 0 by UUID (flag 1, manager="openpbs").
# It also checks that the GPU's energy between two hardware counter reads (carried by power
# samples) is within 5% of the counter's own.
# Prints each figure and PASS/FAIL; exits non-zero on a failure. Then prints, without judging
# it, the CPU per scrape of an exporter with only the nvidia collector (the energy counter read
# every 5 minutes, then at every scrape) and of one with none, the CPU per second between
# scrapes, and what a GPU costs per scrape at a 15 s interval, to compare run to run.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${CEEMS_BIN:-target/release/ceems}
port=${PORT:-19010}
job=4242
cg=/sys/fs/cgroup/system.slice/slurmstepd.scope/job_$job/step_0/user/task_0

[ -x "$bin" ] || { echo "gpu-check: no $bin (cargo build --release first)" >&2; exit 2; }
mkdir -p "$cg"
# Controllers down to the job, so it has cpu and memory files like a Slurm job.
for d in /sys/fs/cgroup /sys/fs/cgroup/system.slice /sys/fs/cgroup/system.slice/slurmstepd.scope \
         /sys/fs/cgroup/system.slice/slurmstepd.scope/job_$job; do
  echo "+cpu +memory" > "$d/cgroup.subtree_control" 2>/dev/null || true
done

pbs_job=4243.gpucheck
pbs_cg=/sys/fs/cgroup/pbs_jobs.service/jobid/$pbs_job

cleanup() {
  [ -n "${work:-}" ] && kill "$work" 2>/dev/null || true
  [ -n "${exporter:-}" ] && kill "$exporter" 2>/dev/null || true
  [ -n "${pbs_work:-}" ] && kill "$pbs_work" 2>/dev/null || true
  [ -n "${pbs_exporter:-}" ] && kill "$pbs_exporter" 2>/dev/null || true
  wait 2>/dev/null || true
  rmdir "$pbs_cg" /sys/fs/cgroup/pbs_jobs.service/jobid /sys/fs/cgroup/pbs_jobs.service 2>/dev/null || true
  rmdir "$cg" /sys/fs/cgroup/system.slice/slurmstepd.scope/job_$job/step_0/user \
        /sys/fs/cgroup/system.slice/slurmstepd.scope/job_$job/step_0 \
        /sys/fs/cgroup/system.slice/slurmstepd.scope/job_$job 2>/dev/null || true
}
trap cleanup EXIT

# The workload joins the cgroup before it starts (the shell writes its own pid first).
sh -c "echo \$\$ > $cg/cgroup.procs && exec env SLURM_JOB_ID=$job SLURM_JOB_GPUS=0 CUDA_VISIBLE_DEVICES=0 python3 -c '
import time, torch
x = torch.randn(8192, 8192, device=\"cuda\")
t = time.time()
while time.time() - t < 90:
    y = x @ x
    torch.cuda.synchronize()
'" &
work=$!
sleep 8

"$bin" exporter --collector.slurm --collector.nvidia --collector.gpu.type=nvidia \
  --collector.cgroups.force-version=v2 --web.listen-address=127.0.0.1:$port \
  --log.level=info > /tmp/gpu-check-exporter.log 2>&1 &
exporter=$!
for _ in $(seq 50); do curl -sf "127.0.0.1:$port/metrics" >/dev/null && break; sleep 0.2; done

value() { # metric-with-labels-prefix file
  grep -F "$1" "$2" | head -1 | awk '{print $NF}'
}
# The hardware energy counter (mJ), read beside the scrapes to check the exporter's meter.
hw_energy() {
  python3 -c 'import ctypes
n = ctypes.CDLL("libnvidia-ml.so.1"); n.nvmlInit_v2()
d = ctypes.c_void_p(); n.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(d))
e = ctypes.c_ulonglong(); n.nvmlDeviceGetTotalEnergyConsumption(d, ctypes.byref(e)); print(e.value)'
}
curl -s "127.0.0.1:$port/metrics" > /tmp/gpu-check-1.txt
h1=$(hw_energy)
sleep 10
curl -s "127.0.0.1:$port/metrics" > /tmp/gpu-check-2.txt
h2=$(hw_energy)
smi_power=$(nvidia-smi -i 0 --query-gpu=power.draw --format=csv,noheader,nounits | head -1 | tr -d ' ')

e1=$(grep '^ceems_nvidia_gpu_energy_joules_total{' /tmp/gpu-check-1.txt | grep 'index="0"' | awk '{print $NF}')
e2=$(grep '^ceems_nvidia_gpu_energy_joules_total{' /tmp/gpu-check-2.txt | grep 'index="0"' | awk '{print $NF}')
p=$(grep '^ceems_nvidia_gpu_power_watts{' /tmp/gpu-check-2.txt | grep 'index="0"' | awk '{print $NF}')
flag=$(grep '^ceems_compute_unit_gpu_index_flag{' /tmp/gpu-check-2.txt | grep "uuid=\"$job\"" | grep 'index="0"' | awk '{print $NF}')
j1=$(value "ceems_compute_unit_gpu_energy_joules_total{" /tmp/gpu-check-1.txt)
j2=$(value "ceems_compute_unit_gpu_energy_joules_total{" /tmp/gpu-check-2.txt)

fail=0
check() { # name condition-as-python figures
  if python3 -c "import sys; sys.exit(0 if ($2) else 1)"; then echo "PASS $1: $3"; else echo "FAIL $1: $3"; fail=1; fi
}
check "GPU 0 energy counter increases" "${e2:-0} > ${e1:-0} > 0" "${e1:-none} J -> ${e2:-none} J in 10 s"
check "power within 10% of nvidia-smi" "abs(${p:-0} - ${smi_power:-0}) <= 0.1 * ${smi_power:-1}" "ceems ${p:-none} W, nvidia-smi ${smi_power:-none} W"
check "job $job mapped to GPU 0" "${flag:-0} == 1" "flag ${flag:-none}"
check "job GPU energy increases" "${j2:-0} > ${j1:-0}" "${j1:-none} J -> ${j2:-none} J"
# The second scrape's energy comes from power samples (the counter is read every 5 minutes).
check "energy between counter reads within 5% of the hardware's" \
  "abs((${e2:-0} - ${e1:-0}) - (${h2:-0} - ${h1:-0}) / 1000) <= 0.05 * (${h2:-0} - ${h1:-0}) / 1000" \
  "ceems +$(python3 -c "print(round(${e2:-0} - ${e1:-0}, 1))") J, hardware +$(python3 -c "print(round((${h2:-0} - ${h1:-0}) / 1000, 1))") J"

# An OpenPBS job on v2, its GPU named by UUID as PBS's hook names it.
mkdir -p "$pbs_cg"
for d in /sys/fs/cgroup /sys/fs/cgroup/pbs_jobs.service /sys/fs/cgroup/pbs_jobs.service/jobid; do
  echo "+cpu +memory" > "$d/cgroup.subtree_control" 2>/dev/null || true
done
gpu0=$(nvidia-smi -i 0 --query-gpu=uuid --format=csv,noheader | tr -d ' ')
sh -c "echo \$\$ > $pbs_cg/cgroup.procs && exec env PBS_JOBID=$pbs_job CUDA_VISIBLE_DEVICES=$gpu0 python3 -c '
import time, torch
x = torch.randn(4096, 4096, device=\"cuda\")
t = time.time()
while time.time() - t < 40:
    y = x @ x
    torch.cuda.synchronize()
'" &
pbs_work=$!
sleep 8
pbs_port=$((port + 2))
"$bin" exporter --collector.openpbs --collector.nvidia --collector.gpu.type=nvidia \
  --collector.cgroups.force-version=v2 --web.listen-address=127.0.0.1:$pbs_port \
  --log.level=info > /tmp/gpu-check-openpbs.log 2>&1 &
pbs_exporter=$!
for _ in $(seq 50); do curl -sf "127.0.0.1:$pbs_port/metrics" >/dev/null && break; sleep 0.2; done
curl -s "127.0.0.1:$pbs_port/metrics" > /tmp/gpu-check-3.txt
pbs_flag=$(grep '^ceems_compute_unit_gpu_index_flag{' /tmp/gpu-check-3.txt | grep "uuid=\"$pbs_job\"" \
  | grep 'manager="openpbs"' | grep 'index="0"' | awk '{print $NF}')
check "OpenPBS job $pbs_job mapped to GPU 0 by UUID" "${pbs_flag:-0} == 1" "flag ${pbs_flag:-none} ($gpu0)"
kill "$pbs_exporter" "$pbs_work" 2>/dev/null || true

# CPU per scrape (from /proc/<pid>/stat) over 1,000 scrapes, after one to warm up.
cpu_per_scrape() {
  local p=$((port + 1)) pid before after
  "$bin" exporter --collector.disable-defaults --web.disable-exporter-metrics "$@" \
    --web.listen-address=127.0.0.1:$p --log.level=error &
  pid=$!
  for _ in $(seq 50); do curl -sf "127.0.0.1:$p/metrics" >/dev/null && break; sleep 0.2; done
  before=$(awk '{print $14 + $15}' /proc/$pid/stat)
  for _ in $(seq 1000); do curl -sf "127.0.0.1:$p/metrics" -o /dev/null; done
  after=$(awk '{print $14 + $15}' /proc/$pid/stat)
  kill $pid; wait $pid 2>/dev/null || true
  awk -v d=$((after - before)) -v t="$(getconf CLK_TCK)" 'BEGIN {printf "%.3f", d * 1000 / t / 1000}'
}
# CPU per second of the power sampler thread between scrapes, over 10 s (its schedstat, in ns).
sampler_cpu_per_second() {
  local p=$((port + 1)) pid task before after
  "$bin" exporter --collector.disable-defaults --web.disable-exporter-metrics --collector.nvidia \
    --web.listen-address=127.0.0.1:$p --log.level=error &
  pid=$!
  for _ in $(seq 50); do curl -sf "127.0.0.1:$p/metrics" >/dev/null && break; sleep 0.2; done
  task=$(grep -l '^ceems-gpu-power$' /proc/$pid/task/*/comm | head -1 | xargs dirname)
  before=$(awk '{print $1}' "$task/schedstat")
  sleep 10
  after=$(awk '{print $1}' "$task/schedstat")
  kill $pid; wait $pid 2>/dev/null || true
  awk -v d=$((after - before)) 'BEGIN {printf "%.4f", d / 1e6 / 10}'
}
gpus=$(nvidia-smi -L | grep -c '^GPU')
every=$(cpu_per_scrape --collector.nvidia --collector.nvidia.energy-counter-interval=0s)
with=$(cpu_per_scrape --collector.nvidia)
without=$(cpu_per_scrape)
idle=$(sampler_cpu_per_second)
echo "nvidia collector: $with ms CPU per scrape with $gpus GPU(s) (energy counter read every 5m), $every ms reading it at every scrape, $without ms without the collector; the power sampler between scrapes: $idle ms CPU per second"
# At a 15 s scrape interval: a scrape, 15 s of sampling, and a counter read every 20 scrapes.
python3 -c "print('nvidia collector at a 15 s scrape interval: %.3f ms CPU per scrape per GPU' % ((($with - $without) + 15 * $idle + ($every - $with) / 20) / $gpus))"
exit $fail
