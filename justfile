# Everyday tasks. `just --list` shows them.

# Run the exporter on this node with the Slurm collector.
run *ARGS:
    cargo run --release -- exporter --collector.slurm {{ARGS}}

# Every test, as CI runs it.
test:
    ./scripts/test.sh

# Rebuild the eBPF object (bpf/ceems.bpf.o) from bpf/ceems.bpf.c with clang.
bpf:
    ./scripts/build-bpf.sh

lint:
    cargo fmt --all -- --check
    cargo clippy --all-targets -- -D warnings

# Criterion benchmark: one scrape against the floor of reading the same files.
bench:
    cargo bench --bench scrape

# Whole-process CPU per scrape and RSS at 0-1000 jobs.
bench-process:
    ./scripts/bench.sh

# Fuzz one parser (needs cargo-fuzz; stable toolchain via RUSTC_BOOTSTRAP).
fuzz TARGET SECONDS="60":
    cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run {{TARGET}} -- -max_total_time={{SECONDS}}
