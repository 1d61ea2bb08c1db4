#!/usr/bin/env bash
# A real one-node OpenPBS complex on this machine (server, scheduler, comm, MoM and PBS's own
# PostgreSQL data service), built from vendor/openpbs-*.tar.gz, with the pbs_cgroups
# hook putting jobs in cgroups of the v1 hierarchies here. For tests/openpbs_lab.rs.
# Idempotent: installs and builds what is missing, writes the configuration, starts what is not
# running and waits until the node is free. Needs root. See docs/openpbs-lab.md.
#   scripts/openpbs-lab.sh          set up and start
#   scripts/openpbs-lab.sh stop     stop the daemons
#   scripts/openpbs-lab.sh env      print the variables the tests read
# The complex lives in the network namespace `pbslab` (PBS refuses a server name on loopback):
# its clients run from this host as usual (`/opt/pbs/bin/qstat`). User alice (2001) submits
# jobs. The server's `mailer` is /run/ceems-lab/pbs-mailer, which drops mail until a
# test puts `ceems mailprog` behind it.
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
  echo "openpbs-lab: needs root" >&2
  exit 1
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
prefix=${OPENPBS_PREFIX:-/opt/pbs}
build_dir=${OPENPBS_BUILD_DIR:-/var/tmp/openpbs-build}
tarball=${OPENPBS_TARBALL:-}
if [ -z "$tarball" ]; then
  for t in "$repo"/vendor/openpbs-*.tar.gz "$repo"/../shared/vendor/openpbs-*.tar.gz; do
    [ -f "$t" ] && tarball=$t && break
  done
fi
name=pbslab
netns=/run/netns/$name
server_ip=10.99.0.1
in_ns() { nsenter --net="$netns" "$@"; }

if [ "${1:-}" = env ]; then
  echo "OPENPBS_PREFIX=$prefix"
  echo "OPENPBS_NETNS=$netns"
  echo "OPENPBS_SERVER=$name"
  exit 0
fi

stop() {
  [ -e "$netns" ] && [ -x "$prefix/libexec/pbs_init.d" ] && in_ns "$prefix/libexec/pbs_init.d" stop >/dev/null 2>&1 || true
}
if [ "${1:-}" = stop ]; then
  stop
  exit 0
fi

wait_for() { # seconds, command...
  local n=$(( $1 * 10 )); shift
  until "$@" >/dev/null 2>&1; do
    n=$((n - 1))
    if [ "$n" -le 0 ]; then echo "openpbs-lab: timed out waiting for: $*" >&2; return 1; fi
    sleep 0.1
  done
}

# Build once (about 3 minutes on 2 cores); the prefix is outside the repository.
if [ ! -x "$prefix/sbin/pbs_server.bin" ]; then
  [ -f "$tarball" ] || { echo "openpbs-lab: no OpenPBS source tarball (set OPENPBS_TARBALL)" >&2; exit 1; }
  deps=(gcc make libtool libhwloc-dev libx11-dev libxt-dev libedit-dev libical-dev libncurses-dev perl
        postgresql-server-dev-all postgresql-contrib python3-dev tcl-dev tk-dev swig libexpat-dev libssl-dev
        libxext-dev libxft-dev autoconf automake g++ libcjson-dev expat postgresql)
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${deps[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${deps[@]}" >/dev/null; }
  started=$(date +%s)
  rm -rf "$build_dir" && mkdir -p "$build_dir"
  tar xzf "$tarball" -C "$build_dir" --strip-components=1
  (
    cd "$build_dir"
    ./autogen.sh
    # Another python3 may come first on PATH (pyenv): PBS embeds the system's.
    PYTHON=/usr/bin/python3 ./configure --prefix="$prefix"
    make -j"$(nproc)"
    make install
  ) >"$build_dir.log" 2>&1 || { tail -30 "$build_dir.log" >&2; echo "openpbs-lab: build failed, see $build_dir.log" >&2; exit 1; }
  # make install leaves out the setuid bit that non-root clients' resvport authentication needs.
  chmod 4755 "$prefix/sbin/pbs_iff" "$prefix/sbin/pbs_rcp"
  echo "openpbs-lab: built OpenPBS in $(( $(date +%s) - started )) s" >&2
fi

# The network: the daemons run in a namespace of their own, at 10.99.0.1 on one end of a veth
# pair; the other end, 10.99.0.2, is this host's, so PBS's clients (qsub, qstat) and ceems
# reach the server from here as from any login node.
if [ ! -e "$netns" ]; then
  ip netns add "$name"
fi
if ! ip -n "$name" addr show veth-a 2>/dev/null | grep -q "$server_ip/" \
   || ! ip addr show veth-b 2>/dev/null | grep -q "10.99.0.2/"; then
  ip -n "$name" link del veth-a 2>/dev/null || true
  ip link del veth-b 2>/dev/null || true
  ip -n "$name" link add veth-a type veth peer name veth-b netns 1
  ip -n "$name" addr add "$server_ip/24" dev veth-a
  ip addr add 10.99.0.2/24 dev veth-b
  ip -n "$name" link set veth-a up
  ip link set veth-b up
  ip -n "$name" link set lo up
fi
grep -qE "^$server_ip[[:space:]]+$name\$" /etc/hosts || echo "$server_ip $name" >> /etc/hosts

id alice >/dev/null 2>&1 || useradd -m -u 2001 alice
# PBS starts a job in its owner's home: an alice added earlier without one (another test's
# `useradd -M`) gets hers, or every job fails with "Could not chdir to Home directory".
home=$(getent passwd alice | cut -d: -f6)
[ -d "$home" ] || { mkdir -p "$home" && chown alice: "$home"; }
mkdir -p /run/ceems-lab
if [ ! -x /run/ceems-lab/pbs-mailer ]; then
  printf '#!/bin/sh\ncat >/dev/null\nexit 0\n' > /run/ceems-lab/pbs-mailer
  chmod 755 /run/ceems-lab/pbs-mailer
fi

# PBS_HOME, once; pbs_init.d's first start initialises it (pbs_habitat) and the data service.
if [ ! -d /var/spool/pbs ]; then
  PBS_SERVER=$name PBS_START_MOM=1 "$prefix/libexec/pbs_postinstall" </dev/null >/dev/null 2>&1
fi
cat > /etc/pbs.conf.new <<EOF
PBS_SERVER=$name
PBS_START_SERVER=1
PBS_START_SCHED=1
PBS_START_COMM=1
PBS_START_MOM=1
PBS_EXEC=$prefix
PBS_HOME=/var/spool/pbs
PBS_CORE_LIMIT=unlimited
PBS_SCP=/usr/bin/scp
PBS_MOM_NODE_NAME=$name
PBS_LEAF_NAME=$name
EOF
mv /etc/pbs.conf.new /etc/pbs.conf

# nsenter, not `ip netns exec`: that one remounts /sys, which hides the cgroup hierarchies from
# the MoM and its pbs_cgroups hook ("cgroups enabled but not mounted").
if ! "$prefix/bin/qstat" -B >/dev/null 2>&1; then
  in_ns "$prefix/libexec/pbs_init.d" start </dev/null >/var/log/openpbs-lab-start.log 2>&1 || true
  if ! wait_for 60 "$prefix/bin/qstat" -B; then
    # A first start can leave no server behind; create it once.
    echo y | in_ns "$prefix/sbin/pbs_server" -t create >>/var/log/openpbs-lab-start.log 2>&1 || true
    wait_for 60 "$prefix/bin/qstat" -B || { tail -20 /var/log/openpbs-lab-start.log >&2; exit 1; }
  fi
fi

# Output files are copied with cp: the MoM would otherwise scp them to itself.
mom_config=/var/spool/pbs/mom_priv/config
if [ -f "$mom_config" ] && ! grep -q '^\$usecp' "$mom_config"; then
  echo '$usecp *:/ /' >> "$mom_config"
  pkill -HUP -x pbs_mom 2>/dev/null || true
fi

qmgr() { in_ns "$prefix/bin/qmgr" -c "$1"; }
qmgr "list node $name" >/dev/null 2>&1 || qmgr "create node $name"
qmgr "list queue workq" >/dev/null 2>&1 \
  || qmgr "create queue workq queue_type=execution,enabled=true,started=true"
qmgr "set server default_queue=workq"
qmgr "set server flatuid=true"
qmgr "set server scheduling=true"
# Finished jobs stay visible to `qstat -x` (the stats-server's check of a single job).
qmgr "set server job_history_enable=true"
qmgr "set server mailer=/run/ceems-lab/pbs-mailer"
qmgr "set server mail_from=pbs@$name"
# The stats-server's policies end jobs with qdel as root from this host, outside the
# complex's network namespace: an operator wherever it comes from.
qmgr "set server operators=root@*"
# Jobs in cgroups: the hook's defaults (cpuacct, cpuset, memory) work on the v1 hierarchies.
qmgr "set hook pbs_cgroups enabled=true"

# The stats-server's user (nobody in the tests) reads the accounting log through server_priv
# (root's, mode 750), as `ceems check-privileges stats-server` advises.
command -v setfacl >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends acl >/dev/null 2>&1 \
  || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends acl >/dev/null; }
setfacl -m u:nobody:x /var/spool/pbs/server_priv

wait_for 60 sh -c "$prefix/bin/pbsnodes $name | grep -q 'state = free'" \
  || { "$prefix/bin/pbsnodes" "$name" >&2; exit 1; }
echo "openpbs-lab: node $name is free" >&2
