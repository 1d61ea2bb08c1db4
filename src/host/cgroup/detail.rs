//! Optional detail of a unit beyond CEEMS's series: memory breakdown and peak, CPU time per
//! core (v1 only: v2 keeps no per-core figure per cgroup), and block IO per device.

use std::collections::HashMap;
use std::path::Path;

use super::parse::{self, IoStat};
use super::{CgroupReader, CgroupVersion, FileFault};
use crate::host::ParseError;

/// Which detail groups to read.
#[derive(Debug, Clone, Copy, Default)]
pub struct DetailOptions {
    pub memory: bool,
    pub per_core: bool,
    pub io: bool,
}

impl DetailOptions {
    pub fn any(&self) -> bool {
        self.memory || self.per_core || self.io
    }
}

/// Memory breakdown, in bytes, under one set of names for v1 and v2.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MemoryDetail {
    pub rss_huge: f64,
    pub mapped_file: f64,
    pub active_file: f64,
    pub inactive_file: f64,
    pub unevictable: f64,
    pub shmem: f64,
    /// v1 `memory.max_usage_in_bytes`, v2 `memory.peak` (kernels ≥ 5.19).
    pub max_used: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct UnitDetail {
    pub memory: Option<MemoryDetail>,
    /// Seconds per CPU, indexed by CPU number.
    pub per_core_seconds: Vec<f64>,
    pub io: Vec<IoStat>,
}

/// v1 `memory.stat` keys (job level: the `total_` rows cover the subtree), then v2 keys, in
/// the order of [`MemoryDetail`]'s fields.
const V1_MEMORY_KEYS: [&str; 6] = [
    "total_rss_huge",
    "total_mapped_file",
    "total_active_file",
    "total_inactive_file",
    "total_unevictable",
    "total_shmem",
];
const V2_MEMORY_KEYS: [&str; 6] = [
    "anon_thp",
    "file_mapped",
    "active_file",
    "inactive_file",
    "unevictable",
    "shmem",
];

fn memory_detail(values: [u64; 6], max_used: Option<u64>) -> MemoryDetail {
    let [rss_huge, mapped_file, active_file, inactive_file, unevictable, shmem] =
        values.map(|v| v as f64);
    MemoryDetail {
        rss_huge,
        mapped_file,
        active_file,
        inactive_file,
        unevictable,
        shmem,
        max_used: max_used.map(|v| v as f64),
    }
}

/// `cpuacct.usage_percpu`: nanoseconds per CPU, space separated.
pub fn percpu(text: &str) -> Result<Vec<u64>, ParseError> {
    text.split_ascii_whitespace()
        .map(|v| {
            v.parse()
                .map_err(|_| ParseError::new(1, format!("`{v}` is not an unsigned integer")))
        })
        .collect()
}

/// v1 `blkio.throttle.io_service_bytes` or `io_serviced`: `8:0 Read 123` lines (and a `Total`
/// line) → per device (read, write).
pub fn blkio_throttle(text: &str) -> Result<Vec<(u32, u32, u64, u64)>, ParseError> {
    let mut out: Vec<(u32, u32, u64, u64)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut f = line.split_ascii_whitespace();
        let (Some(dev), Some(op)) = (f.next(), f.next()) else {
            continue;
        };
        if dev == "Total" {
            continue;
        }
        let Some(value) = f.next() else {
            return Err(ParseError::new(
                i + 1,
                format!("expected `dev op value`, got `{line}`"),
            ));
        };
        let (major, minor) = dev
            .split_once(':')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
            .ok_or_else(|| {
                ParseError::new(i + 1, format!("`{dev}` is not a major:minor device"))
            })?;
        let v: u64 = value
            .parse()
            .map_err(|_| ParseError::new(i + 1, format!("`{value}` is not an unsigned integer")))?;
        let pos = match out.iter().position(|d| d.0 == major && d.1 == minor) {
            Some(p) => p,
            None => {
                out.push((major, minor, 0, 0));
                out.len() - 1
            }
        };
        match op {
            "Read" => out[pos].2 = v,
            "Write" => out[pos].3 = v,
            _ => {}
        }
    }
    Ok(out)
}

/// `/proc/diskstats` → (major, minor) → device name.
pub fn diskstats_names(text: &str) -> HashMap<(u32, u32), String> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_ascii_whitespace();
            let major = f.next()?.parse().ok()?;
            let minor = f.next()?.parse().ok()?;
            Some(((major, minor), f.next()?.to_owned()))
        })
        .collect()
}

impl CgroupReader {
    /// Reads the detail groups asked for. Missing files leave their group empty.
    pub fn read_detail(
        &mut self,
        rel: &Path,
        opts: DetailOptions,
        faults: &mut Vec<FileFault>,
    ) -> UnitDetail {
        let mut d = UnitDetail::default();
        self.enter(rel);
        match self.version {
            CgroupVersion::V1 => {
                let (memory, cpuacct) = (self.v1.memory.clone(), self.v1.cpuacct.clone());
                let blkio = self.root.join("blkio");
                if opts.memory {
                    let values = self.scratch.read(&memory, rel, "memory.stat", faults, |t| {
                        parse::keyed_values(t, V1_MEMORY_KEYS)
                    });
                    let max = self.scratch.read(
                        &memory,
                        rel,
                        "memory.max_usage_in_bytes",
                        faults,
                        parse::single_u64,
                    );
                    d.memory = values.map(|v| memory_detail(v, max));
                }
                if opts.per_core {
                    d.per_core_seconds = self
                        .scratch
                        .read(&cpuacct, rel, "cpuacct.usage_percpu", faults, percpu)
                        .unwrap_or_default()
                        .into_iter()
                        .map(|ns| ns as f64 / 1e9)
                        .collect();
                }
                if opts.io {
                    // The _recursive files cover the job's whole subtree (tasks sit in leaves).
                    let read = |s: &mut Self, file: &str, faults: &mut Vec<FileFault>| {
                        s.scratch
                            .read(
                                &blkio,
                                rel,
                                &format!("{file}_recursive"),
                                faults,
                                blkio_throttle,
                            )
                            .or_else(|| s.scratch.read(&blkio, rel, file, faults, blkio_throttle))
                            .unwrap_or_default()
                    };
                    let bytes = read(self, "blkio.throttle.io_service_bytes", faults);
                    let ios = read(self, "blkio.throttle.io_serviced", faults);
                    d.io = bytes
                        .iter()
                        .map(|&(major, minor, rbytes, wbytes)| {
                            let (rios, wios) = ios
                                .iter()
                                .find(|i| i.0 == major && i.1 == minor)
                                .map(|i| (i.2, i.3))
                                .unwrap_or((0, 0));
                            IoStat {
                                major,
                                minor,
                                rbytes,
                                wbytes,
                                rios,
                                wios,
                            }
                        })
                        // v1 lists every device the cgroup ever saw; v2's io.stat only those
                        // with IO. Keep to v2's rule.
                        .filter(|io| io.rbytes + io.wbytes + io.rios + io.wios > 0)
                        .collect();
                }
            }
            CgroupVersion::V2 => {
                let root = self.root.clone();
                if opts.memory {
                    let values = self.scratch.read(&root, rel, "memory.stat", faults, |t| {
                        parse::keyed_values(t, V2_MEMORY_KEYS)
                    });
                    let peak =
                        self.scratch
                            .read(&root, rel, "memory.peak", faults, parse::single_u64);
                    d.memory = values.map(|v| memory_detail(v, peak));
                }
                if opts.io {
                    d.io = self
                        .scratch
                        .read(&root, rel, "io.stat", faults, parse::io_stat)
                        .unwrap_or_default();
                }
                // No per-core CPU time per cgroup on v2: export nothing rather than a guess.
            }
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers() {
        assert_eq!(percpu("100 200 0\n").unwrap(), vec![100, 200, 0]);
        assert!(percpu("1 x").is_err());
        let b = blkio_throttle(
            "8:0 Read 4096\n8:0 Write 8192\n8:0 Sync 1\n8:0 Async 2\n8:0 Total 12288\n8:16 Write 5\nTotal 12293\n",
        )
        .unwrap();
        assert_eq!(b, vec![(8, 0, 4096, 8192), (8, 16, 0, 5)]);
        assert!(blkio_throttle("8:x Read 1\n").is_err());
        assert!(blkio_throttle("8:0 Read\n").is_err());
        let names = diskstats_names("   8       0 sda 1 2 3\n 259 1 nvme0n1p1 0\ngarbage\n");
        assert_eq!(names[&(8, 0)], "sda");
        assert_eq!(names[&(259, 1)], "nvme0n1p1");
    }

    proptest::proptest! {
        #[test]
        fn never_panic(s in "\\PC*") {
            let _ = percpu(&s);
            let _ = blkio_throttle(&s);
            let _ = diskstats_names(&s);
        }
    }
}
