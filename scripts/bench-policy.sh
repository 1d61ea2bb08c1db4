#!/usr/bin/env bash
# A policy cycle against a real TSDB: Debian's VictoriaMetrics loaded with two hours of
# `uuid:ceems_gpu_usage:ratio` (every 30 s) and of the energy series for each of JOBS running
# one-GPU jobs, half of them idle; then two cycles of a dry-run policy (warn after 1 h) over a
# store that holds those jobs: the first decides for every idle job, the second finds nothing
# new. Prints each cycle's wall time, queries and decisions, for each JOBS given (default
# 1,000 and 10,000). Asserts nothing. Needs root to install VictoriaMetrics when missing.
#   scripts/bench-policy.sh [JOBS...]
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=("${@:-1000 10000}")
read -r -a sizes <<<"${sizes[*]}"
command -v victoria-metrics >/dev/null || apt-get install -y victoria-metrics >/dev/null
cargo build --release --locked -q --example bench-policy
dir=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
vm="http://127.0.0.1:$port"
victoria-metrics -storageDataPath="$dir/vm" -httpListenAddr="127.0.0.1:$port" \
  -retentionPeriod=3d -search.maxUniqueTimeseries=5000000 -loggerLevel=ERROR >/dev/null 2>&1 &
pids+=("$!")
until curl -sf "$vm/health" >/dev/null; do sleep 0.2; done
now=$(date +%s)
for jobs in "${sizes[@]}"; do
  python3 - "$jobs" "$now" <<'PY' | curl -sf -X POST -T - "$vm/api/v1/import"
import json, sys
jobs, now = int(sys.argv[1]), int(sys.argv[2])
ts = [(now - 7200 + 30 * k) * 1000 for k in range(240)]
for i in range(jobs):
    uuid = str(1_000_000 + i)
    use = 0.0 if i % 2 == 0 else 55.0
    for name, value in (("uuid:ceems_gpu_usage:ratio", use),
                        ("uuid:ceems_host_power_watts:pue", 400.0),
                        ("uuid:ceems_host_emissions_g_s:pue", 0.006)):
        print(json.dumps({"metric": {"__name__": name, "uuid": uuid, "gpuuuid": f"GPU-{i}"},
                          "values": [value] * len(ts), "timestamps": ts}))
PY
  curl -sf "$vm/internal/force_flush" >/dev/null
  mkdir -p "$dir/store-$jobs"
  target/release/examples/bench-policy "$jobs" "$vm" "$dir/store-$jobs" "$now"
done
