#!/usr/bin/env bash
# The whole test suite: lint, then every test (compat, real kernel, real Prometheus, promtool,
# real IPMI tools against a simulated BMC, a real Redfish emulator, privileges as root, and the
# packages built, installed and removed, and the job report in headless chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  fi
fi
command -v python3 >/dev/null || { [ "$(id -u)" = 0 ] && apt-get install -y -qq python3 >/dev/null; } || true
# The real IPMI tools, talking to simulated BMCs (tests/ipmi_tools.rs).
if [ "$(id -u)" = 0 ]; then
  if ! command -v ipmitool >/dev/null || ! command -v ipmi-dcmi >/dev/null || ! command -v ipmi_sim >/dev/null; then
    # openipmi's ipmi_sim: a BMC with a sensor repository.
    ipmi_tools=(ipmitool freeipmi-tools openipmi)
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${ipmi_tools[@]}" >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${ipmi_tools[@]}" >/dev/null; }
  fi
  # A real browser for the job report page (tests/report_lab.rs).
  command -v chromium >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
  python3 -c 'import pyghmi' 2>/dev/null || python3 -m pip install -q pyghmi >/dev/null 2>&1 || true
  # A real Redfish emulator (tests/redfish_emulator.rs).
  python3 -c 'import sushy_tools.static.main' 2>/dev/null || python3 -m pip install -q sushy-tools >/dev/null 2>&1 || true
  # A real SMTP server for the mail tests (tests/mail.rs, tests/slurm_mail_lab.rs).
  python3 -c 'import aiosmtpd' 2>/dev/null || python3 -m pip install -q aiosmtpd >/dev/null 2>&1 || true
  # Debian's MUNGE, whose munged the cacct tests start with keys of their own (tests/cacct.rs).
  command -v munged >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends munge >/dev/null 2>&1 \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends munge >/dev/null; }
  # A real long-term store behind Prometheus's remote write (tests/victoria_metrics_lab.rs).
  command -v victoria-metrics >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends victoria-metrics >/dev/null 2>&1 \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends victoria-metrics >/dev/null; }
fi
# The eBPF object is rebuilt from its C source, so the tests load what clang just built.
if [ "$(id -u)" = 0 ]; then
  bash scripts/build-bpf.sh
fi
# A real PostgreSQL for the stats-server's second backend (tests/postgres.rs and the store's
# tests run again on it below).
if [ "$(id -u)" = 0 ]; then
  CEEMS_TEST_POSTGRES_URL=$(bash scripts/postgres-lab.sh fresh)
  export CEEMS_TEST_POSTGRES_URL
fi
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
# Every fuzz target still compiles against today's crate (sharing the main target directory,
# so the dependencies checked above are not checked again).
(cd fuzz && CARGO_TARGET_DIR=../target cargo check --locked --bins)
cargo test --locked
if [ -n "${CEEMS_TEST_POSTGRES_URL:-}" ]; then
  CEEMS_TEST_STORE=postgres cargo test --locked --lib -- store:: notify:: policy::
fi
# Build the .deb and .rpm, install the .deb, check it, remove it (root only).
bash scripts/package-test.sh
