#!/usr/bin/env bash
# What `ceems lb` adds to a query's time: N instant queries (default 2,000) of one user's own
# job, one at a time, alternately straight to Prometheus and through the lb (which parses the
# PromQL, checks the job's owner in the stats-server's SQLite database of J jobs, default
# 10,000, and relays). Prints p50 and p99 of each and of the per-pair difference; asserts
# nothing. Needs Debian's prometheus (as the tests install it).
#   scripts/bench-lb.sh [N] [J]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2000}
jobs=${2:-10000}
cargo build --release --locked -q
dir=$(mktemp -d)
chmod 755 "$dir"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$dir"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now=$(date +%s)
# J finished jobs of 100 users; user0 owns job 1000.
python3 - "$jobs" "$now" "$dir/sacct.txt" <<'PY'
import sys
n, now, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
with open(path, "w") as f:
    for i in range(n):
        u = i % 100
        s = now - 3600
        f.write(f"{1000+i}|cpu|normal|proj{u % 10}|user{u}|{5000+u}|user{u}|{5000+u}|{s}|{s}|Unknown|00:01:00|60|0:0|RUNNING|billing=2,cpu=2,mem=2G,node=1|cn001|/home/user{u}|120|job {i}\n")
PY
printf '#!/bin/sh\nexec /bin/cat %s\n' "$dir/sacct.txt" > "$dir/sacct"
chmod 755 "$dir/sacct" "$dir/sacct.txt"
api=$(free_port)
target/release/ceems stats-server --web.listen-address=127.0.0.1:$api --storage.data.path="$dir/data" \
  --slurm.sacct.path="$dir/sacct" --slurm.sacctmgr.path= --slurm.run-as-user= \
  --storage.first-window=2d --storage.update-interval=1h --slurm.cluster-id=bench \
  --security.drop-privileges=false --log.level=warn &
pids+=($!)
until curl -sf "127.0.0.1:$api/metrics" | awk -v n="$jobs" '/^ceems_stats_ingested_rows_total/ && $2 >= n {ok=1} END {exit !ok}'; do
  sleep 0.5
done
# A node serving the CPU time of 100 of those jobs.
node=$(free_port)
python3 - "$node" <<'PY' &
import http.server, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        t = time.time()
        body = "".join(f'ceems_compute_unit_cpu_user_seconds_total{{uuid="{1000+i}"}} {t*(i+1)}\n' for i in range(100)).encode()
        self.send_response(200); self.send_header("Content-Type", "text/plain"); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
pids+=($!)
prom=$(free_port)
cat > "$dir/prometheus.yml" <<EOF
global: {scrape_interval: 1s, scrape_timeout: 1s}
scrape_configs: [{job_name: node, static_configs: [{targets: ['127.0.0.1:$node']}]}]
EOF
prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
  --web.listen-address=127.0.0.1:$prom --log.level=error 2>/dev/null &
pids+=($!)
lb=$(free_port)
target/release/ceems lb --web.listen-address=127.0.0.1:$lb --lb.backend=bench=http://127.0.0.1:$prom \
  --storage.data.path="$dir/data" --security.drop-privileges=false --log.level=warn &
pids+=($!)
q='rate(ceems_compute_unit_cpu_user_seconds_total{uuid="1000"}[1m])'
until curl -sf "127.0.0.1:$prom/api/v1/query" --data-urlencode "query=$q" | grep -q '"uuid":"1000"'; do sleep 0.5; done
until curl -sf -H 'X-Grafana-User: user0' "127.0.0.1:$lb/api/v1/query" --data-urlencode "query=$q" | grep -q '"uuid":"1000"'; do sleep 0.5; done
python3 - "$n" "$prom" "$lb" "$q" <<'PY'
import http.client, sys, time, urllib.parse
n, prom, lb, q = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
path = "/api/v1/query?" + urllib.parse.urlencode({"query": q})
def one(port, headers):
    c = http.client.HTTPConnection("127.0.0.1", port)
    t = time.perf_counter()
    c.request("GET", path, headers=headers)
    r = c.getresponse(); r.read()
    d = time.perf_counter() - t
    c.close()
    assert r.status == 200, r.status
    return d
direct, through, diff = [], [], []
for _ in range(n):
    a = one(prom, {})
    b = one(lb, {"X-Grafana-User": "user0"})
    direct.append(a); through.append(b); diff.append(b - a)
def pct(v, p):
    v = sorted(v); return v[min(len(v) - 1, int(p / 100 * len(v)))] * 1000
print(f"{n} queries each, one at a time:")
print(f"  Prometheus      p50 {pct(direct,50):.3f} ms  p99 {pct(direct,99):.3f} ms")
print(f"  through ceems lb p50 {pct(through,50):.3f} ms  p99 {pct(through,99):.3f} ms")
print(f"  added           p50 {pct(diff,50):.3f} ms  p99 {pct(diff,99):.3f} ms")
PY
