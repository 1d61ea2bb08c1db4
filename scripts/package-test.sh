#!/usr/bin/env bash
# Builds the .deb and .rpm, installs the .deb on this machine (root only), checks what an
# operator relies on, and removes it again. Prints "package: N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "package test skipped: needs root (dpkg -i)"
  exit 0
fi
mapfile -t pkgs < <(bash scripts/package.sh)
deb=${pkgs[0]}
rpm=${pkgs[1]}
passed=0
failed=0
check() {
  local what=$1
  shift
  if "$@" >/tmp/ceems-package-check.log 2>&1; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAILED: $what"
    sed 's/^/    /' /tmp/ceems-package-check.log
  fi
}
cleanup() { dpkg --purge ceems >/dev/null 2>&1 || true; }
trap cleanup EXIT

check "rpm is an RPM with the binary and the units" \
  sh -c "test -s '$rpm' && head -c 4 '$rpm' | od -An -tx1 | grep -q 'ed ab ee db'"
dpkg -i "$deb" >/dev/null
check "binary and CEEMS's names installed" \
  sh -c 'test -x /usr/bin/ceems && for l in ceems_exporter ceems_api_server redfish_proxy ceems_lb ceems_tool ceems_k8s_admission_controller; do test "$(readlink /usr/bin/$l)" = ceems || exit 1; done'
check "ceems_exporter --help runs the exporter" \
  sh -c '/usr/bin/ceems_exporter --help | grep -q -- --collector.slurm'
check "ceems check-privileges passes as root" \
  /usr/bin/ceems check-privileges exporter --config.file=/etc/ceems/ceems.toml --web.listen-address=127.0.0.1:0
check "config file is a conffile readable by the ceems user only" \
  sh -c 'dpkg-query -W -f="\${Conffiles}" ceems | grep -q /etc/ceems/ceems.toml && test "$(stat -c %U:%G:%a /etc/ceems/ceems.toml)" = root:ceems:640 && getent passwd ceems >/dev/null'
check "the installed config runs Slurm jobs and a power source, and the guide is installed" \
  sh -c '/usr/bin/ceems_exporter --config.file=/etc/ceems/ceems.toml --web.listen-address=127.0.0.1:19011 2>/dev/null & pid=$!; sleep 1; m=$(curl -s http://127.0.0.1:19011/metrics); kill $pid; echo "$m" | grep -q "collector=\"slurm\"" && echo "$m" | grep -q "collector=\"rapl\"" && test -s /usr/share/doc/ceems/guide/slurm.md && test -s /usr/share/doc/ceems/examples/ceems.toml'
check "cacct is setgid ceems and its config readable by group ceems only" \
  sh -c 'test "$(stat -c %U:%G:%a /usr/bin/cacct)" = root:ceems:2755 && test "$(stat -c %U:%G:%a /etc/ceems/config.yml)" = root:ceems:640 && /usr/bin/cacct --helpformat | grep -q jobID'
check "units installed and verified" \
  systemd-analyze verify --man=no /lib/systemd/system/ceems_exporter.service /lib/systemd/system/redfish_proxy.service /lib/systemd/system/ceems_api_server.service /lib/systemd/system/ceems_lb.service
check "man pages and completions installed" \
  sh -c 'ls /usr/share/man/man1/ceems-exporter.1* && test -s /usr/share/bash-completion/completions/ceems && test -s /usr/share/zsh/vendor-completions/_ceems'
dpkg --purge ceems >/dev/null
check "removal leaves no binary or link" \
  sh -c '! test -e /usr/bin/ceems && ! test -e /usr/bin/ceems_exporter && ! test -e /usr/bin/redfish_proxy && ! test -e /usr/bin/ceems_lb && ! test -e /usr/bin/ceems_tool && ! test -e /usr/bin/ceems_k8s_admission_controller && ! test -e /usr/bin/cacct'
echo "package: $passed passed, $failed failed"
[ "$failed" = 0 ]
