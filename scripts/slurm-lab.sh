#!/usr/bin/env bash
# A real Slurm cluster on this machine (Debian's Slurm 22.05, slurmdbd on MariaDB, munge), with
# proctrack/cgroup and jobacct_gather/cgroup on cgroup v1, for the tests that need real jobs.
# Idempotent: installs what is missing, writes the configuration, starts what is not running,
# and waits until the nodes are idle. Needs root.
# Two nodes: `localhost` (this host; partition debug, the default) and `node2`, a second slurmd
# in network, mount and UTS namespaces of its own (10.98.0.2 on a veth pair, its own spool,
# pid and log directories), so `-p multi -N2` runs a job on both. Debian's Slurm is built for
# several slurmds per host: each node's cgroups are under slurm_<node>.
#   scripts/slurm-lab.sh          set up and start
#   scripts/slurm-lab.sh stop     stop the daemons
# Users alice (2001, account physics) and bob (2002, account chemistry) can submit jobs.
# Two fake GPUs (gres, dummy character devices under /run/ceems-lab-gpus): `--gres=gpu:1`
# gives a job SLURM_JOB_GPUS as on a GPU node, for the GPU mapping tests.
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
  echo "slurm-lab: needs root" >&2
  exit 1
fi

node2_dir=/run/ceems-lab/node2

# One set-up at a time: tests call this script in parallel, and two runs creating node2's
# network would trip over each other. The daemons started below do not keep the lock's fd.
exec 9>/run/ceems-slurm-lab.lock
flock 9

stop() {
  for pidfile in $node2_dir/run/slurmd.pid /run/slurm/slurmd.pid /run/slurm/slurmctld.pid /run/slurm/slurmdbd.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  sleep 1
}

if [ "${1:-}" = stop ]; then
  stop
  exit 0
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null \
   || [ ! -x /usr/sbin/slurmrestd ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq slurm-wlm slurmdbd slurmrestd mariadb-server munge >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq slurm-wlm slurmdbd slurmrestd mariadb-server munge >/dev/null; }
fi

running() { pgrep -x "$1" >/dev/null; }
wait_for() { # seconds, command...
  local n=$(( $1 * 10 )); shift
  until "$@" >/dev/null 2>&1; do
    n=$((n - 1))
    if [ "$n" -le 0 ]; then echo "slurm-lab: timed out waiting for: $*" >&2; return 1; fi
    sleep 0.1
  done
}

# munge: the system's munged answering on its default socket (another munged, a test's with its
# own key and socket, does not count).
if ! munge -n </dev/null >/dev/null 2>&1; then
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none; }
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge
  runuser -u munge -- /usr/sbin/munged 9>&-
fi

# MariaDB for slurmdbd
if ! running mariadbd; then
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  (mariadbd --user=mysql --innodb-buffer-pool-size=128M >/var/log/slurm-lab-mariadb.log 2>&1 9>&- &)
  wait_for 30 mariadb -e 'select 1'
fi
db_pass=slurmlab
mariadb -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$db_pass'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"

# Configuration
node=$(hostname)
cpus=$(nproc)
mem_mib=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/slurm
chown slurm:slurm /var/spool/slurmctld /var/log/slurm /run/slurm
gpu_dir=/run/ceems-lab-gpus
mkdir -p "$gpu_dir"
for n in 0 1; do
  [ -c "$gpu_dir/gpu$n" ] || mknod -m 666 "$gpu_dir/gpu$n" c 195 "$n"
done
# slurmctld's MailProg: a test puts `ceems mailprog` behind this path (tests/slurm_mail_lab.rs);
# until then it takes the mail and drops it.
mkdir -p /run/ceems-lab
if [ ! -x /run/ceems-lab/mailprog ]; then
  printf '#!/bin/sh\nexit 0\n' > /run/ceems-lab/mailprog
  chmod 755 /run/ceems-lab/mailprog
fi
# slurmrestd over HTTP authenticates with JWTs (tests/slurmrestd_lab.rs).
jwt_key=/var/spool/slurmctld/jwt_hs256.key
if [ ! -s "$jwt_key" ]; then
  dd if=/dev/urandom bs=32 count=1 of="$jwt_key" status=none
fi
chown slurm:slurm "$jwt_key" && chmod 600 "$jwt_key"
cat > /etc/slurm/gres.conf <<CONF
NodeName=localhost Name=gpu File=$gpu_dir/gpu[0-1]
CONF
# node2's network: 10.98.0.2 in namespace slurmn2, this host 10.98.0.1 at the veth's other end.
if [ ! -e /run/netns/slurmn2 ]; then
  ip netns add slurmn2
fi
# Read whole before matching: `grep -q` stops reading, and under pipefail a SIGPIPE to `ip`
# would read as an address missing.
inside=$(ip -n slurmn2 -o -4 addr show dev veth-s2 2>/dev/null || true)
outside=$(ip -o -4 addr show dev veth-s1 2>/dev/null || true)
if [[ $inside != *"10.98.0.2/"* || $outside != *"10.98.0.1/"* ]]; then
  ip -n slurmn2 link del veth-s2 2>/dev/null || true
  ip link del veth-s1 2>/dev/null || true
  ip -n slurmn2 link add veth-s2 type veth peer name veth-s1 netns 1
  ip -n slurmn2 addr add 10.98.0.2/24 dev veth-s2
  ip addr add 10.98.0.1/24 dev veth-s1
  ip -n slurmn2 link set veth-s2 up
  ip link set veth-s1 up
  ip -n slurmn2 link set lo up
  ip -n slurmn2 route add default via 10.98.0.1
fi
grep -qE "^10\.98\.0\.2[[:space:]]+node2\$" /etc/hosts || echo "10.98.0.2 node2" >> /etc/hosts
mkdir -p $node2_dir/spool $node2_dir/run $node2_dir/log
# In node2's namespaces, SlurmctldHost (localhost) and this host's node are at 10.98.0.1.
printf '127.0.0.1 loopback\n10.98.0.1 localhost %s\n10.98.0.2 node2\n' "$node" > $node2_dir/hosts
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=lab
SlurmctldHost=localhost
SlurmUser=slurm
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$jwt_key
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
JobAcctGatherType=jobacct_gather/cgroup
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerParameters=batch_sched_delay=0
DefMemPerCPU=1000
ReturnToService=2
MailProg=/run/ceems-lab/mailprog
GresTypes=gpu
AccountingStorageTRES=gres/gpu
# node2 first: while a cluster's only node is named localhost, slurmctld takes any name for it,
# and a later node2 is then "Duplicated NodeHostName node2".
NodeName=node2 NodeHostname=node2 NodeAddr=10.98.0.2 CPUs=$cpus RealMemory=$mem_mib State=UNKNOWN
NodeName=localhost NodeHostname=$node CPUs=$cpus RealMemory=$mem_mib Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=multi Nodes=localhost,node2 MaxTime=INFINITE State=UP
CONF
cat > /etc/slurm/cgroup.conf <<CONF
CgroupPlugin=cgroup/v1
ConstrainCores=yes
ConstrainRAMSpace=yes
CONF
cat > /etc/slurm/slurmdbd.conf <<CONF
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$jwt_key
DbdHost=localhost
SlurmUser=slurm
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$db_pass
StorageLoc=slurm_acct_db
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurm/slurmdbd.pid
CONF
chown slurm:slurm /etc/slurm/slurmdbd.conf && chmod 600 /etc/slurm/slurmdbd.conf

# Daemons, accounts and users. Daemons started from an older configuration (no GPUs, no JWT)
# are restarted; only when slurmctld answered (a busy one, just after jobs were cancelled,
# may not, and is no reason to restart).
if running slurmd && node_info=$(scontrol show node localhost 2>/dev/null) \
    && config_info=$(scontrol show config 2>/dev/null) \
    && { ! grep -q "Gres=gpu:2" <<<"$node_info" \
         || ! grep -q '^AuthAltTypes *= auth/jwt' <<<"$config_info" \
         || ! scontrol show node node2 >/dev/null 2>&1; }; then
  for d in slurmd slurmctld slurmdbd; do pkill -x "$d" || true; done
  if ! wait_for 30 sh -c '! pgrep -x slurmd && ! pgrep -x slurmctld && ! pgrep -x slurmdbd'; then
    for d in slurmd slurmctld slurmdbd; do pkill -9 -x "$d" || true; done
    wait_for 10 sh -c '! pgrep -x slurmd && ! pgrep -x slurmctld && ! pgrep -x slurmdbd'
  fi
fi
running slurmdbd || slurmdbd 9>&-
wait_for 30 sacctmgr -n list cluster
sacctmgr -i add cluster lab >/dev/null 2>&1 || true
running slurmctld || slurmctld 9>&-
wait_for 30 scontrol ping
# A slurmctld started from an older configuration (no MailProg) reads it again.
scontrol show config | grep -q '^MailProg *= /run/ceems-lab/mailprog' || scontrol reconfigure
for spec in "alice 2001 physics" "bob 2002 chemistry" "carol 2003 physics"; do
  set -- $spec
  id -u "$1" >/dev/null 2>&1 || useradd -m -u "$2" "$1"
  home=$(getent passwd "$1" | cut -d: -f6)
  [ -d "$home" ] || { mkdir -p "$home" && chown "$1": "$home"; }
  sacctmgr -i add account "$3" >/dev/null 2>&1 || true
  sacctmgr -i add user "$1" account="$3" >/dev/null 2>&1 || true
done
# This host's slurmd: the one whose pid file is here (node2's is under $node2_dir).
pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
pid_alive /run/slurm/slurmd.pid || slurmd 9>&-
if ! pid_alive $node2_dir/run/slurmd.pid; then
  # Its own hostname, /etc/hosts, spool, pid and log directories; the cgroup hierarchies and
  # munge's socket are the host's. nsenter, not `ip netns exec`, which remounts /sys.
  nsenter --net=/run/netns/slurmn2 unshare --mount --uts --propagation private sh -c "
    hostname node2
    mount --bind $node2_dir/hosts /etc/hosts
    mount --bind $node2_dir/spool /var/spool/slurmd
    mount --bind $node2_dir/run /run/slurm
    mount --bind $node2_dir/log /var/log/slurm
    exec slurmd -N node2" 9>&- \
    || echo "slurm-lab: node2's slurmd did not start; the two-node tests will say so" >&2
fi
for n in localhost node2; do
  scontrol update nodename=$n state=resume >/dev/null 2>&1 || true
done
wait_for 60 sh -c 'sinfo -h -n localhost -o %t | grep -Eq "^(idle|mix|alloc)"'
# node2 only serves the two-node tests, which say so when it is missing: not a failure here.
wait_for 30 sh -c 'sinfo -h -n node2 -o %t | grep -Eq "^(idle|mix|alloc)"' \
  || echo "slurm-lab: node2 is not up: $(sinfo -h -n node2 -o '%t %E'); see $node2_dir/log/slurmd.log" >&2
echo "slurm-lab: nodes $(sinfo -h -N -p multi -o '%N=%t' | tr '\n' ' ')on $node with $cpus CPUs each"
