//! The floors a slurm scrape is compared with in `scripts/bench.sh`: CPU per scrape of reading
//! the same files with nothing done with them, (a) opening, reading and closing each, (b) with
//! `pread` on descriptors opened once. Both walk discovery's directories and, on v2, read each
//! job's `cgroup.events`, as a scrape does. A third, (c) the least any exporter does, adds to
//! (b) parsing each file with ceems's parsers as a scrape does (keyed files only as far as the
//! keys it takes) and writing 13 series a job (as many as a scrape has) in the text format,
//! labels rendered once: no HTTP, no threads, no checks.
//!
//! `read-floor CGROUPFS v1|v2 SCRAPES [swap] [psi]` prints `naive_ms kept_ms jobs files work_ms`.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use ceems::host::cgroup::{self, parse, CgroupVersion, V1Controllers};
use ceems::metrics::format_float;
use ceems::testing::accounting_files;
use nix::sys::resource::{getrusage, UsageWho};

/// The subdirectories of `dir` whose names start with `prefix`, sorted.
fn subdirs(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    cgroup::subdirs(dir)
        .into_iter()
        .filter(|d| d.name().to_str().is_some_and(|n| n.starts_with(prefix)))
        .map(|d| d.path)
        .collect()
}

/// Discovery's walk: each job's directory (v2), or its path below the `cpuacct` one (v1).
fn walk(root: &Path, version: CgroupVersion) -> Vec<PathBuf> {
    match version {
        CgroupVersion::V2 => subdirs(&root.join("system.slice"), "")
            .iter()
            .filter(|d| d.to_string_lossy().ends_with("slurmstepd.scope"))
            .flat_map(|scope| subdirs(scope, "job_"))
            .collect(),
        CgroupVersion::V1 => {
            let cpuacct = V1Controllers::resolve(root).cpuacct;
            subdirs(&cpuacct, "slurm")
                .iter()
                .flat_map(|s| subdirs(s, "uid_"))
                .flat_map(|u| subdirs(&u, "job_"))
                .filter_map(|j| j.strip_prefix(&cpuacct).ok().map(Path::to_path_buf))
                .collect()
        }
    }
}

fn cpu_ms() -> anyhow::Result<f64> {
    let u = getrusage(UsageWho::RUSAGE_SELF)?;
    let ms = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e3 + t.tv_usec() as f64 / 1e3;
    Ok(ms(u.user_time()) + ms(u.system_time()))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(root), Some(version), Some(scrapes)) = (args.get(1), args.get(2), args.get(3)) else {
        bail!("usage: read-floor CGROUPFS v1|v2 SCRAPES [swap] [psi]");
    };
    let root = Path::new(root);
    let version = CgroupVersion::from_flag(version).context("version must be v1 or v2")?;
    let scrapes: u32 = scrapes.parse().context("SCRAPES must be a number")?;
    let (swap, psi) = (
        args.iter().any(|a| a == "swap"),
        args.iter().any(|a| a == "psi"),
    );
    let v1 = V1Controllers::resolve(root);
    let files_of = |job: &Path| -> Vec<PathBuf> {
        let mut files = Vec::new();
        let dirs = match version {
            CgroupVersion::V2 => {
                files.push(job.join("cgroup.events"));
                vec![job.to_path_buf()]
            }
            CgroupVersion::V1 => vec![
                v1.cpuacct.join(job),
                v1.memory.join(job),
                v1.cpuset.join(job),
            ],
        };
        files.extend(accounting_files(version, &dirs, swap, psi));
        files
    };
    let jobs = walk(root, version);
    let files: Vec<PathBuf> = jobs.iter().flat_map(|j| files_of(j)).collect();
    let mut buf = Vec::with_capacity(8192);

    let naive = |buf: &mut Vec<u8>| {
        let mut n = 0;
        for job in walk(root, version) {
            for f in files_of(&job) {
                buf.clear();
                if let Ok(mut file) = File::open(&f) {
                    n += file.read_to_end(buf).unwrap_or(0);
                }
            }
        }
        n
    };
    naive(&mut buf);
    let start = cpu_ms()?;
    for _ in 0..scrapes {
        std::hint::black_box(naive(&mut buf));
    }
    let naive_ms = (cpu_ms()? - start) / f64::from(scrapes);

    // In `files`' order, so each job's are found by position; one that cannot be opened is
    // skipped.
    let opened: Vec<Option<File>> = files.iter().map(|f| File::open(f).ok()).collect();
    let kept: Vec<&File> = opened.iter().flatten().collect();
    buf.resize(65536, 0);
    let start = cpu_ms()?;
    for _ in 0..scrapes {
        std::hint::black_box(walk(root, version).len());
        for f in &kept {
            std::hint::black_box(f.read_at(&mut buf, 0).unwrap_or(0));
        }
    }
    let kept_ms = (cpu_ms()? - start) / f64::from(scrapes);

    // (c): the kept reads, parsed, and the series written.
    const SERIES_PER_JOB: usize = 13;
    let per_job: Vec<usize> = jobs.iter().map(|j| files_of(j).len()).collect();
    // Each file parsed as a scrape parses it: keyed files only as far as the keys it takes.
    #[derive(Clone, Copy)]
    enum Kind {
        Pressure,
        Cpuset,
        Keyed([&'static str; 2]),
        KeyedOne(&'static str),
        Populated,
        Single,
    }
    let kinds: Vec<Kind> = files
        .iter()
        .map(
            |f| match f.file_name().and_then(|n| n.to_str()).unwrap_or("") {
                n if n.ends_with(".pressure") => Kind::Pressure,
                n if n.starts_with("cpuset.cpus") => Kind::Cpuset,
                "memory.stat" if version == CgroupVersion::V1 => {
                    Kind::Keyed(["total_rss", "total_cache"])
                }
                "memory.stat" => Kind::Keyed(["anon", "file"]),
                "cpuacct.stat" => Kind::Keyed(["user", "system"]),
                "cpu.stat" => Kind::Keyed(["user_usec", "system_usec"]),
                "memory.events" => Kind::KeyedOne("oom"),
                "cgroup.events" => Kind::Populated,
                _ => Kind::Single,
            },
        )
        .collect();
    let names: Vec<String> = (0..SERIES_PER_JOB)
        .map(|k| format!("ceems_compute_unit_value_{k}"))
        .collect();
    let labels: Vec<String> = (0..jobs.len())
        .map(|j| {
            format!("{{cgrouphostname=\"\",hostname=\"node\",manager=\"slurm\",uuid=\"{j}\"}}")
        })
        .collect();
    let mut values = vec![0f64; jobs.len() * SERIES_PER_JOB];
    let mut body = String::new();
    let start = cpu_ms()?;
    for _ in 0..scrapes {
        std::hint::black_box(walk(root, version).len());
        let mut file = 0;
        for (j, n) in per_job.iter().enumerate() {
            let row = &mut values[j * SERIES_PER_JOB..(j + 1) * SERIES_PER_JOB];
            let mut at = 0;
            let mut put = |v: u64| {
                row[at % SERIES_PER_JOB] = v as f64;
                at += 1;
            };
            for (f, kind) in opened[file..file + n].iter().zip(&kinds[file..file + n]) {
                let Some(f) = f else { continue };
                let len = f.read_at(&mut buf, 0).unwrap_or(0);
                let Ok(text) = std::str::from_utf8(&buf[..len]) else {
                    continue;
                };
                let _ = match *kind {
                    Kind::Pressure => {
                        parse::pressure(text).map(|p| put(p.some_total_us + p.full_total_us))
                    }
                    Kind::Cpuset => parse::cpuset_count(text).map(&mut put),
                    Kind::Keyed(keys) => {
                        parse::keyed_values(text, keys).map(|v| v.into_iter().for_each(&mut put))
                    }
                    Kind::KeyedOne(key) => parse::keyed_values(text, [key]).map(|[v]| put(v)),
                    Kind::Populated => parse::flat_keyed(text, |_, v| put(v)),
                    Kind::Single => parse::single_u64(text).map(&mut put),
                };
            }
            file += n;
        }
        body.clear();
        for (k, name) in names.iter().enumerate() {
            body.push_str("# HELP ");
            body.push_str(name);
            body.push_str(" A value.\n# TYPE ");
            body.push_str(name);
            body.push_str(" gauge\n");
            for (j, l) in labels.iter().enumerate() {
                body.push_str(name);
                body.push_str(l);
                body.push(' ');
                format_float(values[j * SERIES_PER_JOB + k], &mut body);
                body.push('\n');
            }
        }
        std::hint::black_box(body.len());
    }
    let work_ms = (cpu_ms()? - start) / f64::from(scrapes);
    println!(
        "{naive_ms:.2} {kept_ms:.2} {} {} {work_ms:.2}",
        jobs.len(),
        kept.len()
    );
    Ok(())
}
