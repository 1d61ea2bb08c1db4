//! The reader of units' accounting files: one pass over a unit's v1 controllers or v2
//! directory, reusing its buffers and keeping descriptors open between scrapes.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::kept::{DescriptorBudget, KeptFiles};
use super::parse;
use super::{
    CgroupVersion, FileFault, HostMemory, ReadOptions, UnitError, UnitStats, V1Controllers,
};
use crate::host::ParseError;

/// v1 kernels report "no limit" as the largest page-aligned signed value, not u64::MAX.
const V1_UNLIMITED: u64 = 0x7FFF_FFFF_FFFF_F000;

/// Reads units' files under one cgroup root, reusing its buffers between files.
pub struct CgroupReader {
    pub(super) root: PathBuf,
    pub(super) version: CgroupVersion,
    pub(super) v1: V1Controllers,
    host: HostMemory,
    clock_ticks: f64,
    pub(super) scratch: Scratch,
}

/// Buffers reused for every file read of a scrape, and the descriptors kept between scrapes.
pub(super) struct Scratch {
    bytes: Vec<u8>,
    anchor: PathBuf,
    kept: KeptFiles,
}

impl Scratch {
    /// Starts reading the unit at `rel`, whose own directory is `dir/rel`.
    fn enter(&mut self, dir: &Path, rel: &Path) {
        if self.kept.is_current(rel) {
            return;
        }
        self.anchor.clear();
        self.anchor.push(dir);
        self.anchor.push(rel);
        self.kept.enter(rel, &self.anchor, None);
    }

    /// Reads `dir/rel/file` into the shared buffer; `None` means the file does not exist.
    fn load(&mut self, dir: &Path, rel: &Path, file: &str) -> io::Result<Option<usize>> {
        self.kept.read_with(file, &mut self.bytes, |path| {
            path.push(dir);
            path.push(rel);
            path.push(file);
        })
    }

    /// Reads one file and parses it; a missing file yields `None`, a read or parse failure is
    /// recorded in `faults` and also yields `None`, so the other files of the unit still count.
    pub(super) fn read<T>(
        &mut self,
        dir: &Path,
        rel: &Path,
        file: &str,
        faults: &mut Vec<FileFault>,
        parse: impl FnOnce(&str) -> Result<T, ParseError>,
    ) -> Option<T> {
        let parsed = match self.load(dir, rel, file) {
            Ok(None) => return None,
            Ok(Some(n)) => match std::str::from_utf8(&self.bytes[..n]) {
                Ok(text) => parse(text).map_err(|e| e.to_string()),
                Err(e) => Err(format!("not UTF-8: {e}")),
            },
            Err(e) => Err(e.to_string()),
        };
        parsed
            .map_err(|message| {
                faults.push(FileFault {
                    // Read through a kept descriptor, no path was built.
                    path: dir.join(rel).join(file),
                    message,
                })
            })
            .ok()
    }
}

/// Clock ticks per second for v1 `cpuacct.stat`.
pub fn clock_ticks() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as f64,
        _ => 100.0,
    }
}

impl CgroupReader {
    pub fn new(root: &Path, version: CgroupVersion, host: HostMemory) -> CgroupReader {
        CgroupReader::with_budget(root, version, host, DescriptorBudget::process())
    }

    /// As [`CgroupReader::new`], keeping at most what `budget` allows open between scrapes.
    pub fn with_budget(
        root: &Path,
        version: CgroupVersion,
        host: HostMemory,
        budget: Arc<DescriptorBudget>,
    ) -> CgroupReader {
        CgroupReader {
            root: root.to_owned(),
            version,
            v1: V1Controllers::resolve(root),
            host,
            clock_ticks: clock_ticks(),
            scratch: Scratch {
                bytes: vec![0; 4096],
                anchor: PathBuf::with_capacity(256),
                kept: KeptFiles::new(budget),
            },
        }
    }

    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn v1_controllers(&self) -> &V1Controllers {
        &self.v1
    }

    /// Reads the accounting of the unit at `rel`: for v2 a path below the root, for v1 a path
    /// below each controller's directory (e.g. `slurm/uid_1000/job_42`).
    pub fn read_unit(
        &mut self,
        rel: &Path,
        opts: ReadOptions,
        faults: &mut Vec<FileFault>,
    ) -> Result<UnitStats, UnitError> {
        self.enter(rel);
        let read = match self.version {
            CgroupVersion::V1 => self.read_v1(rel, opts, faults),
            CgroupVersion::V2 => self.read_v2(rel, opts, faults),
        };
        if read.is_err() {
            self.scratch.kept.forget_current();
        }
        read
    }

    /// Starts reading the unit at `rel`, found by discovery at `dir` (in any controller)
    /// listed with inode `ino`: its kept descriptors are checked against that, without a
    /// `stat`. [`CgroupReader::read_unit`] and [`CgroupReader::read_detail`] then read it.
    pub fn enter_unit(&mut self, rel: &Path, dir: &Path, ino: Option<u64>) {
        self.scratch.kept.enter(rel, dir, ino);
    }

    /// Starts reading the unit at `rel` unless it is the one entered last.
    pub(super) fn enter(&mut self, rel: &Path) {
        let dir = match self.version {
            CgroupVersion::V1 => &self.v1.cpuacct,
            CgroupVersion::V2 => &self.root,
        };
        self.scratch.enter(dir, rel);
    }

    /// Closes the kept files of the units not read since the last call: call it after each
    /// scrape.
    pub fn end_scrape(&mut self) {
        self.scratch.kept.end_scrape();
    }

    /// Descriptors kept open between scrapes.
    pub fn kept_descriptors(&self) -> usize {
        self.scratch.kept.descriptors()
    }

    fn read_v1(
        &mut self,
        rel: &Path,
        opts: ReadOptions,
        faults: &mut Vec<FileFault>,
    ) -> Result<UnitStats, UnitError> {
        let (cpuacct, memory, cpuset) = (&self.v1.cpuacct, &self.v1.memory, &self.v1.cpuset);
        let mut s = UnitStats::default();
        let ticks = self.clock_ticks;
        let cpu = self
            .scratch
            .read(cpuacct, rel, "cpuacct.stat", faults, |t| {
                parse::keyed_values(t, ["user", "system"])
            });
        match cpu {
            Some([user, system]) => {
                s.cpu_user_seconds = user as f64 / ticks;
                s.cpu_system_seconds = system as f64 / ticks;
            }
            // Only stat the directories when the file is missing: the common path stays at
            // one open per file.
            None if !cpuacct.join(rel).is_dir() && !memory.join(rel).is_dir() => {
                return Err(UnitError::Vanished(rel.to_owned()));
            }
            // On a hybrid host a unit may be in memory but not in cpuacct (libvirt leaves a
            // cpuacct mounted apart from cpu alone); the unified hierarchy counts its CPU.
            None => {
                if let Some([user, system]) =
                    self.scratch
                        .read(&self.v1.unified, rel, "cpu.stat", faults, |t| {
                            parse::keyed_values(t, ["user_usec", "system_usec"])
                        })
                {
                    s.cpu_user_seconds = user as f64 / 1e6;
                    s.cpu_system_seconds = system as f64 / 1e6;
                }
            }
        }
        s.cpus = self
            .scratch
            .read(cpuset, rel, "cpuset.cpus", faults, parse::cpuset_count)
            .unwrap_or(0) as f64;

        if let Some([rss, cache]) = self.scratch.read(memory, rel, "memory.stat", faults, |t| {
            parse::keyed_values(t, ["total_rss", "total_cache"])
        }) {
            s.memory_rss_bytes = rss as f64;
            s.memory_cache_bytes = cache as f64;
        }
        s.memory_used_bytes = self
            .scratch
            .read(
                memory,
                rel,
                "memory.usage_in_bytes",
                faults,
                parse::single_u64,
            )
            .unwrap_or(0) as f64;
        if let Some(limit) = self.scratch.read(
            memory,
            rel,
            "memory.limit_in_bytes",
            faults,
            parse::single_u64,
        ) {
            s.memory_total_bytes = memory_limit(&self.host, limit);
        }
        s.memory_fail_count = self
            .scratch
            .read(memory, rel, "memory.failcnt", faults, parse::single_u64)
            .unwrap_or(0) as f64;
        if opts.swap {
            s.memsw_used_bytes = self
                .scratch
                .read(
                    memory,
                    rel,
                    "memory.memsw.usage_in_bytes",
                    faults,
                    parse::single_u64,
                )
                .unwrap_or(0) as f64;
            if let Some(limit) = self.scratch.read(
                memory,
                rel,
                "memory.memsw.limit_in_bytes",
                faults,
                parse::single_u64,
            ) {
                s.memsw_total_bytes =
                    swap_limit(&self.host, Some(limit).filter(|l| *l < V1_UNLIMITED));
            }
            s.memsw_fail_count = self
                .scratch
                .read(
                    memory,
                    rel,
                    "memory.memsw.failcnt",
                    faults,
                    parse::single_u64,
                )
                .unwrap_or(0) as f64;
        }
        s.rdma = self
            .scratch
            .read(
                &self.v1.rdma,
                rel,
                "rdma.current",
                faults,
                parse::rdma_current,
            )
            .unwrap_or_default();
        // v1 has no per-cgroup PSI: the PSI series stay at 0, as in CEEMS.
        Ok(s)
    }

    fn read_v2(
        &mut self,
        rel: &Path,
        opts: ReadOptions,
        faults: &mut Vec<FileFault>,
    ) -> Result<UnitStats, UnitError> {
        let root = &self.root;
        let mut s = UnitStats::default();
        let cpu = self.scratch.read(root, rel, "cpu.stat", faults, |t| {
            parse::keyed_values(t, ["user_usec", "system_usec"])
        });
        match cpu {
            Some([u, sys]) => {
                s.cpu_user_seconds = u as f64 / 1e6;
                s.cpu_system_seconds = sys as f64 / 1e6;
            }
            // cpu.stat exists in every v2 cgroup; without it the directory is gone.
            None if !root.join(rel).is_dir() => return Err(UnitError::Vanished(rel.to_owned())),
            None => {}
        }
        s.cpus = self
            .scratch
            .read(
                root,
                rel,
                "cpuset.cpus.effective",
                faults,
                parse::cpuset_count,
            )
            .unwrap_or(0) as f64;
        s.memory_used_bytes = self
            .scratch
            .read(root, rel, "memory.current", faults, parse::single_u64)
            .unwrap_or(0) as f64;
        if let Some(limit) = self
            .scratch
            .read(root, rel, "memory.max", faults, parse::limit)
        {
            s.memory_total_bytes = match limit {
                Some(l) => l as f64,
                None if self.host.mem_total_bytes > 0.0 => self.host.mem_total_bytes,
                None => u64::MAX as f64,
            };
        }
        if let Some([anon, file]) = self.scratch.read(root, rel, "memory.stat", faults, |t| {
            parse::keyed_values(t, ["anon", "file"])
        }) {
            s.memory_rss_bytes = anon as f64;
            s.memory_cache_bytes = file as f64;
        }
        s.memory_fail_count = self
            .scratch
            .read(root, rel, "memory.events", faults, |t| {
                parse::keyed_values(t, ["oom"]).map(|[oom]| oom)
            })
            .unwrap_or(0) as f64;
        if opts.swap {
            s.memsw_used_bytes = self
                .scratch
                .read(root, rel, "memory.swap.current", faults, parse::single_u64)
                .unwrap_or(0) as f64;
            if let Some(limit) =
                self.scratch
                    .read(root, rel, "memory.swap.max", faults, parse::limit)
            {
                s.memsw_total_bytes = swap_limit(&self.host, limit);
            }
            // v2 has no swap fail counter; CEEMS reports 0.
        }
        s.rdma = self
            .scratch
            .read(root, rel, "rdma.current", faults, parse::rdma_current)
            .unwrap_or_default();
        if opts.psi {
            if let Some(p) = self
                .scratch
                .read(root, rel, "cpu.pressure", faults, parse::pressure)
            {
                s.cpu_psi_seconds = p.full_total_us as f64 / 1e6;
            }
            if let Some(p) =
                self.scratch
                    .read(root, rel, "memory.pressure", faults, parse::pressure)
            {
                s.memory_psi_seconds = p.full_total_us as f64 / 1e6;
            }
        }
        Ok(s)
    }
}

fn memory_limit(host: &HostMemory, limit: u64) -> f64 {
    if limit >= V1_UNLIMITED && host.mem_total_bytes > 0.0 {
        host.mem_total_bytes
    } else {
        limit as f64
    }
}

/// A swap limit of "none" is reported as the host's swap, or its memory when it has no swap,
/// as CEEMS does.
fn swap_limit(host: &HostMemory, limit: Option<u64>) -> f64 {
    match limit {
        Some(l) => l as f64,
        None if host.swap_total_bytes > 0.0 => host.swap_total_bytes,
        None if host.mem_total_bytes > 0.0 => host.mem_total_bytes,
        None => u64::MAX as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn write(dir: &Path, file: &str, text: &str) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join(file), text).unwrap();
    }

    #[test]
    fn v2_unit_reads_files_and_substitutes_host_limits() {
        let tmp = tempfile::tempdir().unwrap();
        let job = tmp.path().join("system.slice/slurmstepd.scope/job_7");
        write(
            &job,
            "cpu.stat",
            "usage_usec 3000000\nuser_usec 2000000\nsystem_usec 1000000\n",
        );
        write(&job, "cpuset.cpus.effective", "0-3\n");
        write(&job, "memory.current", "100\n");
        write(&job, "memory.max", "max\n");
        write(&job, "memory.stat", "anon 60\nfile 40\n");
        write(
            &job,
            "memory.events",
            "low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n",
        );
        write(&job, "memory.swap.current", "5\n");
        write(&job, "memory.swap.max", "max\n");
        write(
            &job,
            "cpu.pressure",
            "some avg10=0 avg60=0 avg300=0 total=9\nfull avg10=0 avg60=0 avg300=0 total=2500000\n",
        );
        let host = HostMemory {
            mem_total_bytes: 1000.0,
            swap_total_bytes: 0.0,
        };
        let mut r = CgroupReader::new(tmp.path(), CgroupVersion::V2, host);
        let mut faults = Vec::new();
        let rel = Path::new("system.slice/slurmstepd.scope/job_7");
        let s = r
            .read_unit(
                rel,
                ReadOptions {
                    swap: true,
                    psi: true,
                },
                &mut faults,
            )
            .unwrap();
        assert!(faults.is_empty(), "{faults:?}");
        assert_eq!(s.cpu_user_seconds, 2.0);
        assert_eq!(s.cpu_system_seconds, 1.0);
        assert_eq!(s.cpus, 4.0);
        assert_eq!(s.memory_total_bytes, 1000.0);
        assert_eq!(s.memsw_total_bytes, 1000.0);
        assert_eq!(s.memory_fail_count, 1.0);
        assert_eq!(s.cpu_psi_seconds, 2.5);
        assert_eq!((s.memory_rss_bytes, s.memory_cache_bytes), (60.0, 40.0));
    }

    #[test]
    fn malformed_file_is_a_fault_not_a_failure() {
        let tmp = tempfile::tempdir().unwrap();
        let job = tmp.path().join("job_1");
        write(&job, "cpu.stat", "user_usec lots\n");
        write(&job, "memory.current", "42\n");
        let mut r = CgroupReader::new(tmp.path(), CgroupVersion::V2, HostMemory::default());
        let mut faults = Vec::new();
        let s = r
            .read_unit(Path::new("job_1"), ReadOptions::default(), &mut faults)
            .unwrap();
        assert_eq!(faults.len(), 1);
        assert!(faults[0].path.ends_with("job_1/cpu.stat"));
        assert_eq!(s.memory_used_bytes, 42.0);
    }

    #[test]
    fn vanished_unit_is_reported() {
        let tmp = tempfile::tempdir().unwrap();
        for v in [CgroupVersion::V1, CgroupVersion::V2] {
            let mut r = CgroupReader::new(tmp.path(), v, HostMemory::default());
            let err = r.read_unit(Path::new("gone"), ReadOptions::default(), &mut Vec::new());
            assert!(matches!(err, Err(UnitError::Vanished(_))));
        }
    }

    #[test]
    fn v1_unlimited_memory_uses_host_total() {
        let tmp = tempfile::tempdir().unwrap();
        let rel = Path::new("slurm/uid_0/job_1");
        write(
            &tmp.path().join("cpuacct").join(rel),
            "cpuacct.stat",
            "user 250\nsystem 50\n",
        );
        let mem = tmp.path().join("memory").join(rel);
        write(&mem, "memory.limit_in_bytes", "9223372036854771712\n");
        write(&mem, "memory.stat", "rss 0\ntotal_rss 10\ntotal_cache 20\n");
        let host = HostMemory {
            mem_total_bytes: 4096.0,
            swap_total_bytes: 0.0,
        };
        let mut r = CgroupReader::new(tmp.path(), CgroupVersion::V1, host);
        r.clock_ticks = 100.0;
        let s = r
            .read_unit(rel, ReadOptions::default(), &mut Vec::new())
            .unwrap();
        assert_eq!(s.memory_total_bytes, 4096.0);
        assert_eq!((s.cpu_user_seconds, s.cpu_system_seconds), (2.5, 0.5));
        assert_eq!((s.memory_rss_bytes, s.memory_cache_bytes), (10.0, 20.0));
    }

    #[test]
    fn hybrid_host_unit_outside_cpuacct_gets_cpu_from_the_unified_hierarchy() {
        let tmp = tempfile::tempdir().unwrap();
        let rel = Path::new("machine/qemu-1-instance-00000001.libvirt-qemu");
        std::fs::create_dir_all(tmp.path().join("cpuacct")).unwrap();
        write(
            &tmp.path().join("memory").join(rel),
            "memory.usage_in_bytes",
            "64\n",
        );
        write(
            &tmp.path().join("unified").join(rel),
            "cpu.stat",
            "usage_usec 3500000\nuser_usec 500000\nsystem_usec 3000000\n",
        );
        let mut r = CgroupReader::new(tmp.path(), CgroupVersion::V1, HostMemory::default());
        let s = r
            .read_unit(rel, ReadOptions::default(), &mut Vec::new())
            .unwrap();
        assert_eq!((s.cpu_user_seconds, s.cpu_system_seconds), (0.5, 3.0));
        assert_eq!(s.memory_used_bytes, 64.0);
    }
}
