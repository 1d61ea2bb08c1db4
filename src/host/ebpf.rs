//! The eBPF programs of `bpf/ceems.bpf.c` (committed compiled as `bpf/ceems.bpf.o`), loaded
//! and attached with aya, and their maps read back as plain records. Knows nothing of units
//! or metrics: keys are cgroup ids (inode numbers of cgroup directories).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use aya::maps::{HashMap as BpfHashMap, MapData};
use aya::programs::TracePoint;
use aya::{Btf, Ebpf, EbpfLoader, Pod};

use super::ParseError;

/// The compiled object; `scripts/build-bpf.sh` rebuilds it from the C source.
static OBJECT: &[u8] = aya::include_bytes_aligned!("../../bpf/ceems.bpf.o");

/// File IO of one cgroup on one device (`reads` and `writes` maps).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct IoKey {
    pub cgroup: u64,
    /// The kernel's `dev_t`: major in the high 12 bits, minor in the low 20.
    pub dev: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoValue {
    pub bytes: u64,
    pub calls: u64,
    pub errors: u64,
}

/// Opens, creates and unlinks of one cgroup (`file_ops` map).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileOps {
    pub open_calls: u64,
    pub open_errors: u64,
    pub create_calls: u64,
    pub create_errors: u64,
    pub unlink_calls: u64,
    pub unlink_errors: u64,
}

/// Traffic of one cgroup by protocol and address family (`traffic` map).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct NetKey {
    pub cgroup: u64,
    pub proto: u16,
    pub family: u16,
    pub pad: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetValue {
    pub ingress_packets: u64,
    pub ingress_bytes: u64,
    pub egress_packets: u64,
    pub egress_bytes: u64,
    pub retrans_packets: u64,
    pub retrans_bytes: u64,
}

// SAFETY: plain `repr(C)` integers with explicit padding fields, the layout of the C structs
// of the same name in bpf/ceems.bpf.c; any bit pattern is a valid value.
unsafe impl Pod for IoKey {}
unsafe impl Pod for IoValue {}
unsafe impl Pod for FileOps {}
unsafe impl Pod for NetKey {}
unsafe impl Pod for NetValue {}

/// Which programs to attach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramGroup {
    Io,
    Network,
}

/// Program name in the object, tracepoint category and event, group.
const PROGRAMS: &[(&str, &str, &str, ProgramGroup)] = &[
    ("read_enter", "syscalls", "sys_enter_read", ProgramGroup::Io),
    ("read_exit", "syscalls", "sys_exit_read", ProgramGroup::Io),
    (
        "pread_enter",
        "syscalls",
        "sys_enter_pread64",
        ProgramGroup::Io,
    ),
    (
        "pread_exit",
        "syscalls",
        "sys_exit_pread64",
        ProgramGroup::Io,
    ),
    (
        "write_enter",
        "syscalls",
        "sys_enter_write",
        ProgramGroup::Io,
    ),
    ("write_exit", "syscalls", "sys_exit_write", ProgramGroup::Io),
    (
        "pwrite_enter",
        "syscalls",
        "sys_enter_pwrite64",
        ProgramGroup::Io,
    ),
    (
        "pwrite_exit",
        "syscalls",
        "sys_exit_pwrite64",
        ProgramGroup::Io,
    ),
    (
        "openat_enter",
        "syscalls",
        "sys_enter_openat",
        ProgramGroup::Io,
    ),
    (
        "openat_exit",
        "syscalls",
        "sys_exit_openat",
        ProgramGroup::Io,
    ),
    (
        "open_enter_legacy",
        "syscalls",
        "sys_enter_open",
        ProgramGroup::Io,
    ),
    (
        "open_exit_legacy",
        "syscalls",
        "sys_exit_open",
        ProgramGroup::Io,
    ),
    (
        "unlinkat_exit",
        "syscalls",
        "sys_exit_unlinkat",
        ProgramGroup::Io,
    ),
    (
        "unlink_exit_legacy",
        "syscalls",
        "sys_exit_unlink",
        ProgramGroup::Io,
    ),
    (
        "send_length",
        "sock",
        "sock_send_length",
        ProgramGroup::Network,
    ),
    (
        "recv_length",
        "sock",
        "sock_recv_length",
        ProgramGroup::Network,
    ),
    (
        "tcp_destroy",
        "tcp",
        "tcp_destroy_sock",
        ProgramGroup::Network,
    ),
];

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read the kernel's BTF (/sys/kernel/btf/vmlinux; a kernel built without CONFIG_DEBUG_INFO_BTF?): {0}")]
    Btf(String),
    #[error("tracefs is not mounted (at /sys/kernel/tracing or /sys/kernel/debug/tracing): the programs attach to its tracepoints; mount it (systemd's sys-kernel-tracing.mount)")]
    Tracefs,
    #[error("cannot load the eBPF object (IO counting needs Linux 5.12 or later, network counting 6.3): {0}")]
    Object(String),
    #[error("no {group:?} program could be attached: {reasons}")]
    NoneAttached {
        group: ProgramGroup,
        reasons: String,
    },
}

/// The loaded object with its attached programs.
pub struct Programs {
    ebpf: Ebpf,
    /// Programs that could not be loaded or attached, with why (the others still count).
    pub skipped: Vec<(&'static str, String)>,
}

/// Everything the maps hold now.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub reads: Vec<(IoKey, IoValue)>,
    pub writes: Vec<(IoKey, IoValue)>,
    pub file_ops: Vec<(u64, FileOps)>,
    pub traffic: Vec<(NetKey, NetValue)>,
}

/// Loads the object and attaches the programs of `groups`. `cgroup_subsys` is -1 on cgroups
/// v2, else the id of the v1 subsystem whose cgroups key the maps. Needs `CAP_BPF` and
/// `CAP_PERFMON` (or `CAP_SYS_ADMIN`). A group is refused only when none of its programs
/// attached: the others are listed in `skipped`.
pub fn load(groups: &[ProgramGroup], cgroup_subsys: i32) -> Result<Programs, LoadError> {
    let tracefs = [
        "/sys/kernel/tracing/events",
        "/sys/kernel/debug/tracing/events",
    ];
    if !tracefs.iter().any(|p| Path::new(p).is_dir()) {
        return Err(LoadError::Tracefs);
    }
    let btf = Btf::from_sys_fs().map_err(|e| LoadError::Btf(e.to_string()))?;
    let mut ebpf = EbpfLoader::new()
        .btf(Some(&btf))
        .set_global("cgroup_subsys", &cgroup_subsys, true)
        .allow_unsupported_maps()
        .load(OBJECT)
        .map_err(|e| LoadError::Object(chain(&e)))?;
    let mut skipped = Vec::new();
    for group in groups {
        let mut attached = 0;
        let mut reasons = Vec::new();
        for (name, category, event, _) in PROGRAMS.iter().filter(|p| p.3 == *group) {
            match attach(&mut ebpf, name, category, event) {
                Ok(()) => attached += 1,
                Err(e) => {
                    reasons.push(format!("{category}:{event}: {e}"));
                    skipped.push((*event, e));
                }
            }
        }
        if attached == 0 {
            return Err(LoadError::NoneAttached {
                group: *group,
                reasons: reasons.join("; "),
            });
        }
    }
    Ok(Programs { ebpf, skipped })
}

/// An error with its causes, for aya's errors whose Display leaves the OS error out.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn attach(ebpf: &mut Ebpf, name: &str, category: &str, event: &str) -> Result<(), String> {
    let program = ebpf
        .program_mut(name)
        .ok_or_else(|| format!("no program {name} in the object"))?;
    let p: &mut TracePoint = program.try_into().map_err(|e| chain(&e))?;
    p.load().map_err(|e| chain(&e))?;
    p.attach(category, event).map_err(|e| chain(&e))?;
    Ok(())
}

fn entries<K: Pod, V: Pod>(ebpf: &Ebpf, map: &str) -> Vec<(K, V)> {
    let Some(data) = ebpf.map(map) else {
        return Vec::new();
    };
    let Ok(hash) = BpfHashMap::<&MapData, K, V>::try_from(data) else {
        return Vec::new();
    };
    // An entry removed by the kernel (LRU) while iterating ends that one only.
    hash.iter().filter_map(Result::ok).collect()
}

impl Programs {
    /// Reads every map. Needs `CAP_BPF` where unprivileged BPF is off.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            reads: entries(&self.ebpf, "reads"),
            writes: entries(&self.ebpf, "writes"),
            file_ops: entries(&self.ebpf, "file_ops"),
            traffic: entries(&self.ebpf, "traffic"),
        }
    }

    /// Removes the entries of `cgroups` (units that ended), so the maps stay bounded by what runs.
    pub fn forget(&mut self, cgroups: &HashSet<u64>) {
        for map in ["reads", "writes"] {
            remove_where::<IoKey, IoValue>(&mut self.ebpf, map, |k| cgroups.contains(&k.cgroup));
        }
        remove_where::<u64, FileOps>(&mut self.ebpf, "file_ops", |k| cgroups.contains(k));
        remove_where::<NetKey, NetValue>(&mut self.ebpf, "traffic", |k| {
            cgroups.contains(&k.cgroup)
        });
    }
}

fn remove_where<K: Pod, V: Pod>(ebpf: &mut Ebpf, map: &str, gone: impl Fn(&K) -> bool) {
    let Some(data) = ebpf.map_mut(map) else {
        return;
    };
    let Ok(mut hash) = BpfHashMap::<&mut MapData, K, V>::try_from(data) else {
        return;
    };
    let keys: Vec<K> = hash
        .keys()
        .filter_map(Result::ok)
        .filter(|k| gone(k))
        .collect();
    for k in keys {
        let _ = hash.remove(&k);
    }
}

/// The subsystem id of a v1 controller: its row among the controllers of `/proc/cgroups`.
pub fn subsystem_id(proc_cgroups: &str, name: &str) -> Result<Option<i32>, ParseError> {
    let mut id = 0i32;
    for (n, line) in proc_cgroups.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let subsys = line
            .split_whitespace()
            .next()
            .ok_or_else(|| ParseError::new(n + 1, "empty controller line"))?;
        if subsys == name {
            return Ok(Some(id));
        }
        id += 1;
    }
    Ok(None)
}

/// Where each device is mounted, from `/proc/self/mountinfo`: `dev_t` (as the kernel encodes
/// it) → the first mount point listed for it (the first is the file system's own mount; bind
/// mounts come after).
pub fn mount_points(mountinfo: &str) -> Result<HashMap<u32, String>, ParseError> {
    let mut mounts = HashMap::new();
    for (n, line) in mountinfo.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(dev), Some(point)) = (fields.get(2), fields.get(4)) else {
            return Err(ParseError::new(n + 1, "fewer than 5 fields"));
        };
        let (major, minor) = dev
            .split_once(':')
            .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
            .filter(|(a, b)| *a < 1 << 12 && *b < 1 << 20)
            .ok_or_else(|| ParseError::new(n + 1, format!("`{dev}` is not major:minor")))?;
        mounts
            .entry((major << 20) | minor)
            .or_insert_with(|| unescape(point));
    }
    Ok(mounts)
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = bytes[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            if let Ok(b) = u8::try_from(v) {
                out.push(b);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsystem_ids_are_rows_of_proc_cgroups() {
        let text = "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpuset\t3\t1\t1\ncpu\t4\t1\t1\ncpuacct\t5\t1\t1\nblkio\t6\t1\t1\nmemory\t7\t80\t1\n";
        assert_eq!(subsystem_id(text, "memory").unwrap(), Some(4));
        assert_eq!(subsystem_id(text, "cpuset").unwrap(), Some(0));
        assert_eq!(subsystem_id(text, "perf_event").unwrap(), None);
    }

    #[test]
    fn mount_points_by_device() {
        let text = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                    30 22 0:26 / /scratch\\040space rw - tmpfs tmpfs rw\n\
                    31 22 8:1 /home /home rw - ext4 /dev/sda1 rw\n";
        let m = mount_points(text).unwrap();
        assert_eq!(m[&((8 << 20) | 1)], "/");
        assert_eq!(m[&26], "/scratch space");
        assert!(mount_points("1 2 x / /\n").is_err());
        assert!(mount_points("1 2\n").is_err());
    }

    #[test]
    fn record_layouts_match_the_c_structs() {
        assert_eq!(std::mem::size_of::<IoKey>(), 16);
        assert_eq!(std::mem::size_of::<IoValue>(), 24);
        assert_eq!(std::mem::size_of::<FileOps>(), 48);
        assert_eq!(std::mem::size_of::<NetKey>(), 16);
        assert_eq!(std::mem::size_of::<NetValue>(), 48);
    }

    proptest::proptest! {
        #[test]
        fn kernel_text_parsers_never_panic(s in "[0-9a-z:/ \\\\\\n]{0,200}") {
            let _ = mount_points(&s);
            let _ = subsystem_id(&s, "memory");
            let _ = unescape(&s);
        }
    }
}
