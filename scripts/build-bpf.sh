#!/usr/bin/env bash
# Builds the eBPF sub-collector's object from bpf/ceems.bpf.c with clang (Debian's `clang` and
# `libbpf-dev` for the helper headers). The object is committed, so `cargo build` needs no clang;
# CI rebuilds it here before the tests, which then load what was just built.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && { ! command -v clang >/dev/null || [ ! -f /usr/include/bpf/bpf_helpers.h ]; }; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clang llvm libbpf-dev >/dev/null 2>&1 \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clang llvm libbpf-dev >/dev/null; }
fi
arch=$(uname -m | sed -e 's/x86_64/x86/' -e 's/aarch64/arm64/')
clang -O2 -g -Wall -Werror -target bpf -D__TARGET_ARCH_"$arch" -I bpf -I /usr/include/"$(uname -m)"-linux-gnu \
  -c bpf/ceems.bpf.c -o bpf/ceems.bpf.o.tmp
# Keep BTF (CO-RE needs it), drop the DWARF.
llvm-strip --strip-debug bpf/ceems.bpf.o.tmp
mv bpf/ceems.bpf.o.tmp bpf/ceems.bpf.o
echo "built bpf/ceems.bpf.o ($(stat -c %s bpf/ceems.bpf.o) bytes) with $(clang --version | head -1)"
