//! One slurm scrape (discover, read, parse, label, encode) against the floor: walking the same
//! directories and reading the same files with plain `std::fs`, doing nothing with them.
//! Generated trees of 10, 100 and 1,000 jobs, cgroups v1 and v2. Allocations per scrape are
//! counted by a wrapping global allocator and printed before the timings.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fs;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use ceems::collect::Collector;
use ceems::host::cgroup::{CgroupVersion, ReadOptions};
use ceems::manager::slurm::SlurmCollector;
use ceems::metrics::MetricSet;
use ceems::testing::{files_read_per_scrape, generate, JobTree, TreeSpec};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const OPTS: ReadOptions = ReadOptions {
    swap: true,
    psi: true,
};

fn scrape(c: &SlurmCollector, body: &mut String) -> usize {
    let mut out = MetricSet::new();
    c.collect(&mut out).expect("collect");
    body.clear();
    out.encode_text(body);
    body.len()
}

/// Plain reads of what a steady-state scrape reads: the directory listings of discovery, v2's
/// `cgroup.events` per job (v1 jobs seen with processes are trusted for 30 s), and each
/// accounting file.
fn floor(tree: &JobTree, files: &[std::path::PathBuf], buf: &mut String) -> usize {
    fn read(path: &Path, buf: &mut String) -> usize {
        buf.clear();
        match fs::File::open(path) {
            Ok(mut f) => f.read_to_string(buf).unwrap_or(0),
            Err(_) => 0,
        }
    }
    let base = match tree.spec.version {
        CgroupVersion::V2 => tree.cgroupfs().join("system.slice"),
        CgroupVersion::V1 => tree.cgroupfs().join("cpuacct"),
    };
    let mut n = 0;
    let mut jobs = Vec::new();
    for root in fs::read_dir(&base).expect("base").flatten() {
        for child in fs::read_dir(root.path()).expect("root").flatten() {
            match tree.spec.version {
                CgroupVersion::V2 => jobs.push(child.path()),
                CgroupVersion::V1 => jobs.extend(
                    fs::read_dir(child.path())
                        .expect("uid")
                        .flatten()
                        .map(|e| e.path()),
                ),
            }
        }
    }
    if tree.spec.version == CgroupVersion::V2 {
        for j in &jobs {
            n += read(&j.join("cgroup.events"), buf);
        }
    }
    for f in files {
        n += read(f, buf);
    }
    n
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("slurm_scrape");
    group.sample_size(20);
    for version in [CgroupVersion::V1, CgroupVersion::V2] {
        for jobs in [10usize, 100, 1000] {
            let dir = tempfile::tempdir().expect("tempdir");
            let tree = generate(dir.path(), TreeSpec::new(version, jobs)).expect("tree");
            let col = tree.slurm_collector();
            let files = files_read_per_scrape(&tree, OPTS.swap, OPTS.psi);
            let mut body = String::new();
            scrape(&col, &mut body); // warm caches
            let (a0, b0) = (
                ALLOCS.load(Ordering::Relaxed),
                BYTES.load(Ordering::Relaxed),
            );
            let len = scrape(&col, &mut body);
            let (a1, b1) = (
                ALLOCS.load(Ordering::Relaxed),
                BYTES.load(Ordering::Relaxed),
            );
            eprintln!(
                "{version:?} {jobs} jobs: one scrape allocates {} times, {} KiB; body {} KiB",
                a1 - a0,
                (b1 - b0) / 1024,
                len / 1024
            );
            let label = format!("{version:?}");
            group.bench_with_input(
                BenchmarkId::new(format!("scrape_{label}"), jobs),
                &jobs,
                |b, _| b.iter(|| scrape(&col, &mut body)),
            );
            let mut buf = String::with_capacity(4096);
            group.bench_with_input(
                BenchmarkId::new(format!("floor_{label}"), jobs),
                &jobs,
                |b, _| b.iter(|| floor(&tree, &files, &mut buf)),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
