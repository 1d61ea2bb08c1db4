//! Generates realistic Slurm job trees (cgroups v1 or v2 and a matching /proc) in a directory,
//! for tests and benchmarks. The files have the shape and length of real kernel files, so that
//! reading them costs what it costs on a compute node.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::host::cgroup::{CgroupVersion, ReadOptions};
use crate::manager::slurm::SlurmCollector;

/// Layout of a generated tree.
#[derive(Debug, Clone)]
pub struct TreeSpec {
    pub version: CgroupVersion,
    pub jobs: usize,
    /// Steps per job besides `batch` and `extern`.
    pub extra_steps: usize,
    /// First job id; jobs are numbered from here.
    pub first_job: u64,
}

impl TreeSpec {
    pub fn new(version: CgroupVersion, jobs: usize) -> TreeSpec {
        TreeSpec {
            version,
            jobs,
            extra_steps: 1,
            first_job: 1_000_000,
        }
    }
}

/// A generated tree: `root/sys/fs/cgroup` and `root/proc`.
pub struct JobTree {
    pub root: PathBuf,
    pub spec: TreeSpec,
}

impl JobTree {
    pub fn cgroupfs(&self) -> PathBuf {
        self.root.join("sys/fs/cgroup")
    }

    pub fn procfs(&self) -> PathBuf {
        self.root.join("proc")
    }

    pub fn sysfs(&self) -> PathBuf {
        self.root.join("sys")
    }

    /// A slurm collector over this tree, with swap and PSI series on.
    pub fn slurm_collector(&self) -> SlurmCollector {
        SlurmCollector::slurm(
            &self.cgroupfs(),
            &self.procfs(),
            self.spec.version,
            "cpuacct",
            "node",
            ReadOptions {
                swap: true,
                psi: true,
            },
        )
    }

    /// The job's directory: v2 below the root, v1 below the `cpuacct` controller.
    pub fn job_dir(&self, idx: usize) -> PathBuf {
        let id = self.spec.first_job + idx as u64;
        match self.spec.version {
            CgroupVersion::V2 => self
                .cgroupfs()
                .join(format!("system.slice/slurmstepd.scope/job_{id}")),
            CgroupVersion::V1 => self
                .cgroupfs()
                .join(format!("cpuacct/slurm/uid_{}/job_{id}", uid_of(idx))),
        }
    }

    /// Every controller directory of a v1 job, or its one v2 directory.
    pub fn job_dirs(&self, idx: usize) -> Vec<PathBuf> {
        match self.spec.version {
            CgroupVersion::V2 => vec![self.job_dir(idx)],
            CgroupVersion::V1 => {
                let rel = format!(
                    "slurm/uid_{}/job_{}",
                    uid_of(idx),
                    self.spec.first_job + idx as u64
                );
                ["cpuacct", "memory", "cpuset"]
                    .iter()
                    .map(|c| self.cgroupfs().join(c).join(&rel))
                    .collect()
            }
        }
    }
}

fn uid_of(idx: usize) -> u32 {
    2000 + (idx % 50) as u32
}

fn write(dir: &Path, file: &str, text: &str) -> io::Result<()> {
    fs::write(dir.join(file), text)
}

fn v2_memory_stat(anon: u64, file: u64) -> String {
    let mut s = String::with_capacity(1200);
    let _ = write!(s, "anon {anon}\nfile {file}\n");
    for key in [
        "kernel",
        "kernel_stack",
        "pagetables",
        "sec_pagetables",
        "percpu",
        "sock",
        "vmalloc",
        "shmem",
        "zswap",
        "zswapped",
        "file_mapped",
        "file_dirty",
        "file_writeback",
        "swapcached",
        "anon_thp",
        "file_thp",
        "shmem_thp",
        "inactive_anon",
        "active_anon",
        "inactive_file",
        "active_file",
        "unevictable",
        "slab_reclaimable",
        "slab_unreclaimable",
        "slab",
        "workingset_refault_anon",
        "workingset_refault_file",
        "workingset_activate_anon",
        "workingset_activate_file",
        "workingset_restore_anon",
        "workingset_restore_file",
        "workingset_nodereclaim",
        "pgscan",
        "pgsteal",
        "pgfault",
        "pgmajfault",
        "pgrefill",
        "pgactivate",
        "pgdeactivate",
        "thp_fault_alloc",
    ] {
        let _ = writeln!(s, "{key} {}", anon / 7 + key.len() as u64);
    }
    s
}

fn v1_memory_stat(rss: u64, cache: u64) -> String {
    let mut s = String::with_capacity(1000);
    for (prefix, scale) in [("", 0u64), ("total_", 1)] {
        for key in [
            "cache",
            "rss",
            "rss_huge",
            "shmem",
            "mapped_file",
            "dirty",
            "writeback",
            "swap",
            "pgpgin",
            "pgpgout",
            "pgfault",
            "pgmajfault",
            "inactive_anon",
            "active_anon",
            "inactive_file",
            "active_file",
            "unevictable",
        ] {
            let v = match key {
                "rss" => rss * scale,
                "cache" => cache * scale,
                _ => key.len() as u64 * 4096,
            };
            let _ = writeln!(s, "{prefix}{key} {v}");
        }
    }
    s.push_str("hierarchical_memory_limit 9223372036854771712\n");
    s
}

const PSI: &str = "some avg10=0.00 avg60=0.00 avg300=0.00 total=1234567\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=234567\n";

/// Writes the tree under `root` and returns it.
pub fn generate(root: &Path, spec: TreeSpec) -> io::Result<JobTree> {
    let tree = JobTree {
        root: root.to_owned(),
        spec: spec.clone(),
    };
    let proc = tree.procfs();
    fs::create_dir_all(&proc)?;
    write(
        &proc,
        "stat",
        "cpu  301854 612 111922 8979004 3552 2 3944 0 0 0\ncpu0 44490 19 21045 1087069 220 1 3410 0 0 0\ncpu1 47869 23 16474 1110787 591 0 46 0 0 0\nintr 1\nctxt 2\nbtime 3\n",
    )?;
    write(
        &proc,
        "meminfo",
        "MemTotal:       263842356 kB\nMemFree:        200000000 kB\nMemAvailable:   220000000 kB\nSwapTotal:              0 kB\n",
    )?;
    write(
        &proc,
        "cpuinfo",
        "processor\t: 0\nphysical id\t: 0\ncpu cores\t: 1\n\nprocessor\t: 1\nphysical id\t: 0\ncpu cores\t: 1\n\n",
    )?;
    let cg = tree.cgroupfs();
    let mut pid = 10_000u32;
    for idx in 0..spec.jobs {
        let id = spec.first_job + idx as u64;
        let mut steps = vec!["step_batch".to_owned(), "step_extern".to_owned()];
        steps.extend((0..spec.extra_steps).map(|s| format!("step_{s}")));
        let mut job_pids = Vec::new();
        match spec.version {
            CgroupVersion::V2 => {
                let job = cg.join(format!("system.slice/slurmstepd.scope/job_{id}"));
                fs::create_dir_all(&job)?;
                write(
                    &job,
                    "cpu.stat",
                    &format!(
                        "usage_usec {}\nuser_usec {}\nsystem_usec {}\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\nnr_bursts 0\nburst_usec 0\n",
                        3_000_000 + id,
                        2_000_000 + id,
                        1_000_000
                    ),
                )?;
                write(&job, "cpuset.cpus.effective", "0-3,8-11\n")?;
                write(&job, "memory.current", &format!("{}\n", 1_073_741_824 + id))?;
                write(&job, "memory.max", "4294967296\n")?;
                write(
                    &job,
                    "memory.stat",
                    &v2_memory_stat(900_000_000, 100_000_000),
                )?;
                write(
                    &job,
                    "memory.events",
                    "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
                )?;
                write(&job, "memory.swap.current", "0\n")?;
                write(&job, "memory.swap.max", "max\n")?;
                write(&job, "cpu.pressure", PSI)?;
                write(&job, "memory.pressure", PSI)?;
                write(&job, "cgroup.procs", "")?;
                write(&job, "cgroup.events", "populated 1\nfrozen 0\n")?;
                for step in &steps {
                    let step_dir = job.join(step);
                    let slurm = step_dir.join("slurm");
                    fs::create_dir_all(&slurm)?;
                    write(&step_dir, "cgroup.procs", "")?;
                    // slurmstepd has no SLURM_JOB_ID in its environment.
                    write(&slurm, "cgroup.procs", &format!("{}\n", pid + 1_000_000))?;
                    let task = step_dir.join("user/task_0");
                    fs::create_dir_all(&task)?;
                    write(&task, "cgroup.procs", &format!("{pid}\n"))?;
                    job_pids.push(pid);
                    pid += 1;
                }
            }
            CgroupVersion::V1 => {
                let rel = format!("slurm/uid_{}/job_{id}", uid_of(idx));
                let cpuacct = cg.join("cpuacct").join(&rel);
                let memory = cg.join("memory").join(&rel);
                let cpuset = cg.join("cpuset").join(&rel);
                for d in [&cpuacct, &memory, &cpuset] {
                    fs::create_dir_all(d)?;
                    write(d, "cgroup.procs", "")?;
                }
                write(
                    &cpuacct,
                    "cpuacct.stat",
                    &format!("user {}\nsystem 45\n", 39 + id % 1000),
                )?;
                write(
                    &cpuacct,
                    "cpuacct.usage",
                    &format!("{}\n", 1_012_410_966 + id),
                )?;
                write(
                    &memory,
                    "memory.stat",
                    &v1_memory_stat(10_407_936, 21_086_208),
                )?;
                write(&memory, "memory.usage_in_bytes", "40194048\n")?;
                write(&memory, "memory.limit_in_bytes", "4294967296\n")?;
                write(&memory, "memory.failcnt", "0\n")?;
                write(&memory, "memory.memsw.usage_in_bytes", "40325120\n")?;
                write(
                    &memory,
                    "memory.memsw.limit_in_bytes",
                    "9223372036854771712\n",
                )?;
                write(&memory, "memory.memsw.failcnt", "0\n")?;
                write(&cpuset, "cpuset.cpus", "0-1\n")?;
                for step in &steps {
                    for ctrl in [&cpuacct, &memory] {
                        let task = ctrl.join(step).join("task_0");
                        fs::create_dir_all(&task)?;
                        write(&ctrl.join(step), "cgroup.procs", "")?;
                        write(&task, "cgroup.procs", &format!("{pid}\n"))?;
                    }
                    fs::create_dir_all(cpuset.join(step))?;
                    write(&cpuset.join(step), "cgroup.procs", &format!("{pid}\n"))?;
                    job_pids.push(pid);
                    pid += 1;
                }
            }
        }
        for p in job_pids {
            let dir = proc.join(p.to_string());
            fs::create_dir_all(&dir)?;
            write(
                &dir,
                "environ",
                &format!("HOME=/home/u\0SLURM_JOB_ID={id}\0SLURM_JOB_UID={}\0SLURM_JOB_ACCOUNT=physics\0", uid_of(idx)),
            )?;
        }
    }
    Ok(tree)
}

/// The accounting files the slurm collector reads for the tree's jobs, in its order (discovery's
/// `cgroup.procs` walk aside): with that walk, the floor against which a scrape is measured.
pub fn files_read_per_scrape(tree: &JobTree, swap: bool, psi: bool) -> Vec<PathBuf> {
    (0..tree.spec.jobs)
        .flat_map(|idx| accounting_files(tree.spec.version, &tree.job_dirs(idx), swap, psi))
        .collect()
}

/// The accounting files of one job, given its one v2 directory or its v1 `cpuacct`,
/// `memory` and `cpuset` directories, in the order the reader reads them.
pub fn accounting_files(
    version: CgroupVersion,
    dirs: &[PathBuf],
    swap: bool,
    psi: bool,
) -> Vec<PathBuf> {
    let mut out = Vec::new();
    match (version, dirs) {
        (CgroupVersion::V2, [job, ..]) => {
            let mut files = vec![
                "cpu.stat",
                "cpuset.cpus.effective",
                "memory.current",
                "memory.max",
                "memory.stat",
                "memory.events",
            ];
            if swap {
                files.extend(["memory.swap.current", "memory.swap.max"]);
            }
            if psi {
                files.extend(["cpu.pressure", "memory.pressure"]);
            }
            out.extend(files.into_iter().map(|f| job.join(f)));
        }
        (CgroupVersion::V1, [cpuacct, memory, cpuset, ..]) => {
            out.push(cpuacct.join("cpuacct.stat"));
            out.push(cpuset.join("cpuset.cpus"));
            let mut files = vec![
                "memory.stat",
                "memory.usage_in_bytes",
                "memory.limit_in_bytes",
                "memory.failcnt",
            ];
            if swap {
                files.extend([
                    "memory.memsw.usage_in_bytes",
                    "memory.memsw.limit_in_bytes",
                    "memory.memsw.failcnt",
                ]);
            }
            out.extend(files.into_iter().map(|f| memory.join(f)));
        }
        _ => {}
    }
    out
}
