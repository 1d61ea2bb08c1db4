//! The floors a slurm scrape is compared with in `scripts/bench.sh`: CPU per scrape of reading
//! the same files with nothing done with them, (a) opening, reading and closing each, (b) with
//! `pread` on descriptors opened once. Both walk discovery's directories and, on v2, read each
//! job's `cgroup.events`, as a scrape does. A third, (c) the least any exporter does, adds to
//! (b) parsing each file with ceems's parsers as a scrape does (keyed files only as far as the
//! keys it takes) and writing the series a job has with these options (the exporter's family
//! names and label blocks) in the text format, labels rendered once: no HTTP, no threads, no
//! checks.
//!
//! `read-floor CGROUPFS v1|v2 SCRAPES [swap] [psi]` prints `naive_ms kept_ms jobs files work_ms`.
//!
//! With `serve=ADDR` it measures nothing itself: it listens on ADDR and answers each HTTP
//! request, one at a time on one thread, with one scrape of (c) as the body. `bench.sh` times
//! that process as it times the exporter, so the serve floor is (c) plus what sending a body
//! to the same client costs: the least any HTTP exporter does.

use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpListener;
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

/// The families of a job, as the exporter names them: the first 8 always, the 3 swap ones with
/// `swap`, the 2 PSI ones with `psi`.
const SERIES: [&str; 13] = [
    "ceems_compute_unit_cpu_user_seconds_total",
    "ceems_compute_unit_cpu_system_seconds_total",
    "ceems_compute_unit_cpus",
    "ceems_compute_unit_memory_rss_bytes",
    "ceems_compute_unit_memory_cache_bytes",
    "ceems_compute_unit_memory_used_bytes",
    "ceems_compute_unit_memory_total_bytes",
    "ceems_compute_unit_memory_fail_count",
    "ceems_compute_unit_memsw_used_bytes",
    "ceems_compute_unit_memsw_total_bytes",
    "ceems_compute_unit_memsw_fail_count",
    "ceems_compute_unit_cpu_psi_seconds",
    "ceems_compute_unit_memory_psi_seconds",
];

/// How a file is parsed, as a scrape parses it: keyed files only as far as the keys it takes.
#[derive(Clone, Copy)]
enum Kind {
    Pressure,
    Cpuset,
    Keyed([&'static str; 2]),
    KeyedOne(&'static str),
    Populated,
    Single,
}

impl Kind {
    fn of(file: &Path, version: CgroupVersion) -> Kind {
        match file.file_name().and_then(|n| n.to_str()).unwrap_or("") {
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
        }
    }
}

/// Floor (c): the walk, the kept reads parsed, and the series written.
struct WorkFloor<'a> {
    root: &'a Path,
    version: CgroupVersion,
    /// Every job's files in order, `None` where one could not be opened.
    opened: Vec<Option<File>>,
    kinds: Vec<Kind>,
    /// How many of `opened` each job has.
    per_job: Vec<usize>,
    /// Each job's label block.
    labels: Vec<String>,
    series: Vec<&'static str>,
    values: Vec<f64>,
    buf: Vec<u8>,
}

impl WorkFloor<'_> {
    /// One scrape, its series written to `body`.
    fn scrape(&mut self, body: &mut String) {
        std::hint::black_box(walk(self.root, self.version).len());
        let mut file = 0;
        let width = self.series.len();
        for (j, n) in self.per_job.iter().enumerate() {
            let row = &mut self.values[j * width..(j + 1) * width];
            let mut at = 0;
            let mut put = |v: u64| {
                row[at % width] = v as f64;
                at += 1;
            };
            let files = self.opened[file..file + n].iter();
            for (f, kind) in files.zip(&self.kinds[file..file + n]) {
                let Some(f) = f else { continue };
                let len = f.read_at(&mut self.buf, 0).unwrap_or(0);
                let Ok(text) = std::str::from_utf8(&self.buf[..len]) else {
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
        for (k, name) in self.series.iter().enumerate() {
            body.push_str("# HELP ");
            body.push_str(name);
            body.push_str(" A value.\n# TYPE ");
            body.push_str(name);
            body.push_str(" gauge\n");
            for (j, l) in self.labels.iter().enumerate() {
                body.push_str(name);
                body.push_str(l);
                body.push(' ');
                format_float(self.values[j * width + k], body);
                body.push('\n');
            }
        }
    }

    /// Answers each request on `addr` with one scrape, until killed.
    fn serve(&mut self, addr: &str, body: &mut String) -> anyhow::Result<()> {
        let listener =
            TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
        let mut request = Vec::with_capacity(4096);
        let mut head = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            // The request's head, to its blank line (curl's GET has no body).
            request.clear();
            let mut chunk = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&chunk[..n]),
                }
            }
            self.scrape(body);
            head.clear();
            write!(
                head,
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            )?;
            let _ = write_both(&mut stream, &head, body.as_bytes());
        }
        Ok(())
    }
}

/// Writes `head` then `body` with as few `writev`s as the socket takes, copying neither.
fn write_both(out: &mut impl Write, mut head: &[u8], mut body: &[u8]) -> io::Result<()> {
    while !head.is_empty() || !body.is_empty() {
        let n = out.write_vectored(&[IoSlice::new(head), IoSlice::new(body)])?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let from_head = n.min(head.len());
        head = &head[from_head..];
        body = &body[n - from_head..];
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(root), Some(version), Some(scrapes)) = (args.get(1), args.get(2), args.get(3)) else {
        bail!("usage: read-floor CGROUPFS v1|v2 SCRAPES [swap] [psi] [serve=ADDR]");
    };
    let root = Path::new(root);
    let version = CgroupVersion::from_flag(version).context("version must be v1 or v2")?;
    let scrapes: u32 = scrapes.parse().context("SCRAPES must be a number")?;
    let (swap, psi) = (
        args.iter().any(|a| a == "swap"),
        args.iter().any(|a| a == "psi"),
    );
    let serve = args.iter().find_map(|a| a.strip_prefix("serve="));
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
    // In `files`' order, so each job's are found by position; one that cannot be opened is
    // skipped.
    let open_all = || files.iter().map(|f| File::open(f).ok()).collect();

    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default();
    let series: Vec<&str> = SERIES[..8]
        .iter()
        .chain(SERIES[8..11].iter().filter(|_| swap))
        .chain(SERIES[11..].iter().filter(|_| psi))
        .copied()
        .collect();
    let mut work = WorkFloor {
        root,
        version,
        opened: Vec::new(),
        kinds: files.iter().map(|f| Kind::of(f, version)).collect(),
        per_job: jobs.iter().map(|j| files_of(j).len()).collect(),
        labels: jobs
            .iter()
            .map(|j| {
                let name = j.file_name().and_then(|n| n.to_str()).unwrap_or("");
                let uuid = name.strip_prefix("job_").unwrap_or(name);
                format!(
                    "{{cgrouphostname=\"\",hostname=\"{host}\",manager=\"slurm\",uuid=\"{uuid}\"}}"
                )
            })
            .collect(),
        values: vec![0f64; jobs.len() * series.len()],
        series,
        buf: vec![0; 65536],
    };
    let mut body = String::new();
    if let Some(addr) = serve {
        work.opened = open_all();
        return work.serve(addr, &mut body);
    }

    // (a): before any file is kept open, as a scrape without kept files runs.
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
    let mut buf = Vec::with_capacity(8192);
    naive(&mut buf);
    let start = cpu_ms()?;
    for _ in 0..scrapes {
        std::hint::black_box(naive(&mut buf));
    }
    let naive_ms = (cpu_ms()? - start) / f64::from(scrapes);

    // (b)
    work.opened = open_all();
    let kept = work.opened.iter().flatten().count();
    let start = cpu_ms()?;
    for _ in 0..scrapes {
        std::hint::black_box(walk(root, version).len());
        for f in work.opened.iter().flatten() {
            std::hint::black_box(f.read_at(&mut work.buf, 0).unwrap_or(0));
        }
    }
    let kept_ms = (cpu_ms()? - start) / f64::from(scrapes);

    // (c)
    let start = cpu_ms()?;
    for _ in 0..scrapes {
        work.scrape(&mut body);
        std::hint::black_box(body.len());
    }
    let work_ms = (cpu_ms()? - start) / f64::from(scrapes);
    println!(
        "{naive_ms:.2} {kept_ms:.2} {} {kept} {work_ms:.2}",
        jobs.len()
    );
    Ok(())
}
