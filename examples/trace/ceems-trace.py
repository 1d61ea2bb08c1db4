#!/usr/bin/env python3
"""Run a command and report its processes to the ceems exporter's trace endpoint.

    srun ceems-trace.py [--url http://localhost:9010/trace] [--interval 5] -- ./my_app args

Every interval it samples the command and all its descendants (CPU %, resident memory, IO
bytes, threads) from /proc and POSTs them as JSON; the exporter turns them into ceems_trace_*
series. The job id is SLURM_JOB_ID unless --job-id is given. The command's exit status is
this script's. Standard library only.
"""
import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

TICKS = os.sysconf("SC_CLK_TCK")


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def stat_fields(pid):
    text = read(f"/proc/{pid}/stat")
    if text is None:
        return None
    # Fields after the command name, which may hold spaces and parentheses.
    return text[text.rfind(")") + 2:].split()


def descendants(root):
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            f = stat_fields(int(name))
            if f:
                parents.setdefault(int(f[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return out


def sample(pid, previous_ticks, interval):
    f = stat_fields(pid)
    if f is None:
        return None, None
    ticks = int(f[11]) + int(f[12])
    threads = int(f[17])
    rss = 0
    for line in (read(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    io = {}
    for line in (read(f"/proc/{pid}/io") or "").splitlines():
        key, _, value = line.partition(":")
        io[key] = int(value.strip() or 0)
    used = ticks - previous_ticks.get(pid, ticks)
    return ticks, {
        "pid": pid,
        "cpu_percent": max(0.0, 100.0 * used / TICKS / interval),
        "rss_bytes": rss,
        "read_bytes": io.get("read_bytes", 0),
        "write_bytes": io.get("write_bytes", 0),
        "threads": threads,
    }


def post(url, report, warned):
    body = json.dumps(report).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=5).read()
        return False
    except (urllib.error.URLError, OSError) as e:
        if not warned:
            print(f"ceems-trace: cannot report to {url}: {e}", file=sys.stderr)
        return True


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://localhost:9010/trace")
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--job-id", default=os.environ.get("SLURM_JOB_ID", ""))
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command to run")
    if not args.job_id:
        p.error("no job id: run inside a Slurm job or give --job-id")
    child = subprocess.Popen(command)
    ticks, warned = {}, False
    while True:
        try:
            code = child.wait(timeout=args.interval)
        except subprocess.TimeoutExpired:
            code = None
        samples, seen = [], {}
        for pid in descendants(child.pid) if code is None else []:
            t, s = sample(pid, ticks, args.interval)
            if s is not None:
                samples.append(s)
                seen[pid] = t
        ticks = seen
        if samples:
            warned = post(args.url, {"job_id": args.job_id, "samples": samples}, warned) or warned
        if code is not None:
            return code


if __name__ == "__main__":
    sys.exit(main())
