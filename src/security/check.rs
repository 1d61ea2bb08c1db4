//! What `ceems check-privileges` reports: for each enabled part of a daemon, the capabilities it
//! declares, whether this process (started as the daemon would be) holds them, the result of a
//! real privileged operation done the way the daemon does it, and the exact fix.

use std::io;
use std::path::{Path, PathBuf};

use caps::Capability;
use serde::Serialize;

use super::{privileged, with_capabilities, FileCaps, ProcessCaps};

/// The outcome of one real operation.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TestOutcome {
    Ok,
    /// The OS refused: a missing privilege.
    Denied,
    /// Nothing to test on this node (no such device or file).
    NotPresent,
    /// Failed for another reason than privileges.
    Error,
}

#[derive(Debug, Clone, Serialize)]
pub struct OperationTest {
    pub operation: String,
    pub outcome: TestOutcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl OperationTest {
    fn from_io(operation: String, result: io::Result<()>) -> OperationTest {
        let (outcome, error) = match result {
            Ok(()) => (TestOutcome::Ok, None),
            Err(e) => {
                let outcome = match e.kind() {
                    io::ErrorKind::PermissionDenied => TestOutcome::Denied,
                    io::ErrorKind::NotFound => TestOutcome::NotPresent,
                    _ if e.raw_os_error() == Some(nix::libc::EPERM) => TestOutcome::Denied,
                    _ => TestOutcome::Error,
                };
                (outcome, Some(e.to_string()))
            }
        };
        OperationTest {
            operation,
            outcome,
            error,
        }
    }
}

/// One enabled part (a collector, or the listener) and what it needs.
#[derive(Debug, Clone, Serialize)]
pub struct PartCheck {
    pub part: String,
    #[serde(serialize_with = "cap_names")]
    pub needs: Vec<Capability>,
    #[serde(serialize_with = "cap_names")]
    pub missing: Vec<Capability>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test: Option<OperationTest>,
}

impl PartCheck {
    /// No capability missing and the real test, if any, not failed: a test that found nothing
    /// to try on this node (no such device) is not a failure.
    pub fn ok(&self) -> bool {
        self.missing.is_empty()
            && self
                .test
                .as_ref()
                .is_none_or(|t| !matches!(t.outcome, TestOutcome::Denied | TestOutcome::Error))
    }

    /// Why this part is not ready and what to do, for the summary; None when it is.
    pub fn failure(&self) -> Option<String> {
        if self.ok() {
            return None;
        }
        let caps = || {
            self.missing
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let test = self.test.as_ref();
        let said = test
            .and_then(|t| t.error.as_deref())
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        let operation = test.map(|t| t.operation.as_str()).unwrap_or("its test");
        Some(match test.map(|t| &t.outcome) {
            _ if !self.missing.is_empty() => format!(
                "{}: {} missing; grant it with one of the lines below",
                self.part,
                caps()
            ),
            Some(TestOutcome::Denied) => format!(
                "{}: the OS refused `{operation}`{said}; give the daemon's user that access (file mode, ACL or group), then run this check again",
                self.part
            ),
            _ => format!(
                "{}: `{operation}` failed{said}; fix that, then run this check again",
                self.part
            ),
        })
    }
}

fn cap_names<S: serde::Serializer>(caps: &[Capability], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(caps.iter().map(|c| c.to_string()))
}

#[derive(Debug, Clone, Serialize)]
pub struct ProcessReport {
    pub uid: u32,
    pub euid: u32,
    #[serde(serialize_with = "cap_names")]
    pub permitted: Vec<Capability>,
    #[serde(serialize_with = "cap_names")]
    pub effective: Vec<Capability>,
    #[serde(serialize_with = "cap_names")]
    pub ambient: Vec<Capability>,
    #[serde(serialize_with = "cap_names")]
    pub bounding: Vec<Capability>,
}

impl ProcessReport {
    pub fn new(c: &ProcessCaps) -> ProcessReport {
        ProcessReport {
            uid: nix::unistd::getuid().as_raw(),
            euid: nix::unistd::geteuid().as_raw(),
            permitted: c.permitted.clone(),
            effective: c.effective.clone(),
            ambient: c.ambient.clone(),
            bounding: c.bounding.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BinaryReport {
    pub path: PathBuf,
    #[serde(serialize_with = "cap_names")]
    pub file_permitted: Vec<Capability>,
    pub file_effective: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Fix {
    pub setcap: String,
    pub systemd: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sudoers: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub subcommand: String,
    pub ok: bool,
    pub process: ProcessReport,
    pub binary: BinaryReport,
    pub parts: Vec<PartCheck>,
    #[serde(serialize_with = "cap_names")]
    pub needed: Vec<Capability>,
    #[serde(serialize_with = "cap_names")]
    pub missing: Vec<Capability>,
    pub fix: Fix,
}

/// Reads the first RAPL zone's energy, as the `rapl` collector does.
pub fn test_rapl(sysfs: &Path, caps: &[Capability]) -> OperationTest {
    let powercap = sysfs.join("class/powercap");
    let zone = std::fs::read_dir(&powercap).ok().and_then(|entries| {
        let mut dirs: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("energy_uj").exists())
            .collect();
        dirs.sort();
        dirs.into_iter().next()
    });
    match zone {
        None => OperationTest {
            operation: format!("read a RAPL zone under {}", powercap.display()),
            outcome: TestOutcome::NotPresent,
            error: Some("no RAPL zone on this node".into()),
        },
        Some(z) => {
            let file = z.join("energy_uj");
            let path = file.clone();
            let result = privileged(caps, move || std::fs::read(path).map(drop));
            OperationTest::from_io(format!("read {}", file.display()), result)
        }
    }
}

/// A process of another user, and that user: a regular user's if there is one (job processes
/// are), else root's other than pid 1 (which containers often fence off further).
fn foreign_process(procfs: &Path) -> Option<(u32, u32)> {
    let me = nix::unistd::getuid().as_raw();
    let mut pids: Vec<u32> = std::fs::read_dir(procfs)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    let owner = |pid: u32| -> Option<u32> {
        let status = std::fs::read_to_string(procfs.join(pid.to_string()).join("status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let foreign: Vec<(u32, u32)> = pids
        .into_iter()
        .filter(|pid| *pid != 1)
        // Kernel threads (empty cmdline) have no environment.
        .filter(|pid| {
            std::fs::read(procfs.join(pid.to_string()).join("cmdline")).is_ok_and(|c| !c.is_empty())
        })
        .filter_map(|pid| Some((pid, owner(pid)?)))
        .filter(|(_, uid)| *uid != me)
        .collect();
    foreign
        .iter()
        .find(|(_, uid)| *uid != 0)
        .or_else(|| foreign.first())
        .copied()
}

/// This process's user, by name where it has one: for the lines that grant it access.
fn effective_user() -> String {
    let uid = nix::unistd::geteuid();
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |u| u.name)
}

/// Connects to a unix socket as the daemon would (the kubelet's pod-resources socket); a
/// refusal says how to let this user in without root.
pub fn test_unix_socket(socket: &Path) -> OperationTest {
    let mut test = OperationTest::from_io(
        format!("connect to {}", socket.display()),
        std::os::unix::net::UnixStream::connect(socket).map(drop),
    );
    if test.outcome == TestOutcome::Denied {
        let user = effective_user();
        let dir = socket.parent().unwrap_or(Path::new("/"));
        test.error = Some(format!(
            "{}; let {user} in with ACLs, kept when the kubelet makes the socket again: setfacl -m u:{user}:x on each directory above {dir}, setfacl -m u:{user}:rwx,d:u:{user}:rw {dir}, setfacl -m u:{user}:rw {socket}",
            test.error.unwrap_or_default(),
            dir = dir.display(),
            socket = socket.display(),
        ));
    }
    test
}

/// Lists PBS's accounting log directory and opens its newest day, as the stats-server does
/// for an OpenPBS complex. `server_priv` above it is root's (mode 750): an ACL lets the
/// stats-server's user through without reading anything else there.
pub fn test_pbs_accounting(dir: &Path) -> OperationTest {
    let read = std::fs::read_dir(dir).and_then(|entries| {
        let newest = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.len() == 8)
            })
            .max();
        match newest {
            Some(file) => std::fs::File::open(file).map(drop),
            None => Ok(()),
        }
    });
    let mut test = OperationTest::from_io(
        format!("read PBS's accounting log in {}", dir.display()),
        read,
    );
    if test.outcome == TestOutcome::Denied {
        let user = effective_user();
        let above = dir.parent().unwrap_or(Path::new("/"));
        test.error = Some(format!(
            "{}; let {user} through with an ACL: setfacl -m u:{user}:x {above} (the acl package)",
            test.error.unwrap_or_default(),
            above = above.display(),
        ));
    }
    test
}

/// Whether a file that holds credentials is kept from other users: no read bit for others.
pub fn test_secret_file(path: &Path, holds: &str) -> OperationTest {
    use std::os::unix::fs::PermissionsExt;
    let operation = format!("keep {holds} in {} from other users", path.display());
    match std::fs::metadata(path) {
        Err(e) => OperationTest::from_io(operation, Err(e)),
        Ok(m) if m.permissions().mode() & 0o004 != 0 => OperationTest {
            operation,
            outcome: TestOutcome::Error,
            error: Some(format!(
                "{} is readable by every user (mode {:04o}); chmod o-r {} (and give it to the group the server runs as)",
                path.display(),
                m.permissions().mode() & 0o7777,
                path.display()
            )),
        },
        Ok(_) => OperationTest {
            operation,
            outcome: TestOutcome::Ok,
            error: None,
        },
    }
}

/// Reads another user's `/proc/<pid>/environ`, as the slurm collector does for job ids.
pub fn test_foreign_environ(procfs: &Path, caps: &[Capability]) -> OperationTest {
    match foreign_process(procfs) {
        None => OperationTest {
            operation: "read another user's process environment".into(),
            outcome: TestOutcome::NotPresent,
            error: Some("no process of another user is running".into()),
        },
        Some((pid, uid)) => {
            let file = procfs.join(pid.to_string()).join("environ");
            let path = file.clone();
            let result = privileged(caps, move || std::fs::read(path).map(drop));
            OperationTest::from_io(format!("read {} (uid {uid})", file.display()), result)
        }
    }
}

/// Opens a perf counter on another user's process, as the perf sub-collector does in task mode,
/// and says what `kernel.perf_event_paranoid` is.
pub fn test_perf_open(procfs: &Path, caps: &[Capability]) -> OperationTest {
    let paranoid = crate::host::perf::paranoid(procfs);
    let shown = paranoid.map_or("unknown".to_owned(), |p| p.to_string());
    if let Some(p) = paranoid.filter(|p| *p > 2) {
        return OperationTest {
            operation: format!("open a perf counter (kernel.perf_event_paranoid={shown})"),
            outcome: TestOutcome::Denied,
            error: Some(format!(
                "perf_event_paranoid {p} refuses counters to all but root: sysctl kernel.perf_event_paranoid=2"
            )),
        };
    }
    let Some((pid, uid)) = foreign_process(procfs) else {
        return OperationTest {
            operation: format!("open a perf counter (kernel.perf_event_paranoid={shown})"),
            outcome: TestOutcome::NotPresent,
            error: Some("no process of another user is running".into()),
        };
    };
    let event = crate::host::perf::EVENTS
        .iter()
        .find(|e| e.metric == "context_switches")
        .copied();
    let result = privileged(caps, move || {
        let event = event.ok_or_else(|| io::Error::other("no software event known"))?;
        let tid = i32::try_from(pid).map_err(io::Error::other)?;
        crate::host::perf::open(&event, &crate::host::perf::Target::Task(tid)).map(drop)
    });
    OperationTest::from_io(
        format!("open a perf counter on pid {pid} (uid {uid}; kernel.perf_event_paranoid={shown})"),
        result,
    )
}

/// Opens the OpenIPMI device, as native IPMI mode and the IPMI tools do.
pub fn test_ipmi_device(devices: &[&str], caps: &[Capability]) -> OperationTest {
    match devices.iter().map(Path::new).find(|d| d.exists()) {
        None => OperationTest {
            operation: format!("open {}", devices.join(" or ")),
            outcome: TestOutcome::NotPresent,
            error: Some("no OpenIPMI device on this node".into()),
        },
        Some(d) => {
            let device = d.to_owned();
            let result = privileged(caps, move || {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(device)
                    .map(drop)
            });
            OperationTest::from_io(format!("open {}", d.display()), result)
        }
    }
}

/// Runs `program --version` as `user`, as the stats-server runs sacct: the child switches
/// uid and gid with CAP_SETUID/CAP_SETGID raised on a short-lived thread.
pub fn test_run_as(program: &Path, user: &str, caps: &[Capability]) -> OperationTest {
    let operation = format!("run {} --version as {user}", program.display());
    let found = match user.parse::<u32>() {
        Ok(uid) => nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)),
        Err(_) => nix::unistd::User::from_name(user),
    };
    let Some(u) = found.ok().flatten() else {
        return OperationTest {
            operation,
            outcome: TestOutcome::NotPresent,
            error: Some(format!("no user `{user}` on this host")),
        };
    };
    let ids = (u.uid.as_raw(), u.gid.as_raw());
    let result = with_capabilities(caps, || {
        crate::host::command::run_as(
            program,
            &["--version".to_owned()],
            &[],
            std::time::Duration::from_secs(10),
            1 << 20,
            Some(ids),
        )
    });
    match result {
        Ok(_) => OperationTest {
            operation,
            outcome: TestOutcome::Ok,
            error: None,
        },
        Err(crate::host::command::CommandError::Spawn { source, .. }) => {
            OperationTest::from_io(operation, Err(source))
        }
        Err(e) => OperationTest {
            operation,
            outcome: TestOutcome::Error,
            error: Some(e.to_string()),
        },
    }
}

/// The lines that give a daemon `needed`.
pub fn fix(needed: &[Capability], binary: &Path, sudo_commands: &[String]) -> Fix {
    let lower: Vec<String> = needed
        .iter()
        .map(|c| c.to_string().to_lowercase())
        .collect();
    let upper: Vec<String> = needed.iter().map(|c| c.to_string()).collect();
    let setcap = if needed.is_empty() {
        format!("setcap -r {}   # no capability needed", binary.display())
    } else {
        format!("setcap '{}=p' {}", lower.join(","), binary.display())
    };
    let systemd = vec![
        format!("AmbientCapabilities={}", upper.join(" ")),
        format!("CapabilityBoundingSet={}", upper.join(" ")),
    ];
    let sudoers = sudo_commands
        .iter()
        .map(|c| format!("ceems ALL=(root) NOPASSWD: {c}"))
        .collect();
    Fix {
        setcap,
        systemd,
        sudoers,
    }
}

impl Report {
    /// Builds the report; `ok` is false when a needed capability is missing or a part's test
    /// was refused or failed.
    pub fn new(
        subcommand: &str,
        process: ProcessReport,
        binary_path: PathBuf,
        file_caps: Option<FileCaps>,
        parts: Vec<PartCheck>,
        sudo_commands: &[String],
    ) -> Report {
        let needed = super::sorted(parts.iter().flat_map(|p| p.needs.iter().copied()));
        let missing = super::sorted(parts.iter().flat_map(|p| p.missing.iter().copied()));
        let ok = parts.iter().all(PartCheck::ok);
        let fix = fix(&needed, &binary_path, sudo_commands);
        let file_caps = file_caps.unwrap_or_default();
        Report {
            subcommand: subcommand.to_owned(),
            ok,
            process,
            binary: BinaryReport {
                path: binary_path,
                file_permitted: file_caps.permitted,
                file_effective: file_caps.effective,
            },
            parts,
            needed,
            missing,
            fix,
        }
    }

    /// The table an operator reads.
    pub fn text(&self) -> String {
        use std::fmt::Write as _;
        let supported = caps::runtime::thread_all_supported();
        let names = |caps: &[Capability]| {
            if caps.is_empty() {
                "-".to_owned()
            } else if caps.len() * 2 > supported.len() {
                // Root's sets: say what is not there instead.
                let absent: Vec<String> = super::sorted(supported.iter().copied())
                    .into_iter()
                    .filter(|c| !caps.contains(c))
                    .map(|c| c.to_string())
                    .collect();
                if absent.is_empty() {
                    "all".to_owned()
                } else {
                    format!("all but {}", absent.join(","))
                }
            } else {
                caps.iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            }
        };
        let mut out = String::new();
        let p = &self.process;
        let _ = writeln!(
            out,
            "ceems check-privileges {}: uid {} (euid {})",
            self.subcommand, p.uid, p.euid
        );
        let _ = writeln!(out, "  permitted: {}", names(&p.permitted));
        let _ = writeln!(out, "  effective: {}", names(&p.effective));
        let _ = writeln!(out, "  ambient:   {}", names(&p.ambient));
        let _ = writeln!(out, "  bounding:  {}", names(&p.bounding));
        let _ = writeln!(
            out,
            "  binary {}: file capabilities {}{}",
            self.binary.path.display(),
            names(&self.binary.file_permitted),
            if self.binary.file_effective {
                " (+e)"
            } else {
                ""
            }
        );
        let _ = writeln!(out);
        let width = self
            .parts
            .iter()
            .map(|p| p.part.len())
            .max()
            .unwrap_or(0)
            .max(18);
        let _ = writeln!(
            out,
            "{:<width$} {:<36} {:<8} TEST",
            "PART", "NEEDS", "RESULT"
        );
        for part in &self.parts {
            let result = if !part.missing.is_empty() {
                "MISSING"
            } else {
                match part.test.as_ref().map(|t| &t.outcome) {
                    Some(TestOutcome::Denied) => "DENIED",
                    Some(TestOutcome::Error) => "ERROR",
                    _ => "ok",
                }
            };
            let test = match &part.test {
                None => "-".to_owned(),
                Some(t) => match (&t.outcome, &t.error) {
                    (TestOutcome::Ok, _) => format!("{}: ok", t.operation),
                    (_, Some(e)) => format!("{}: {e}", t.operation),
                    (_, None) => t.operation.clone(),
                },
            };
            let _ = writeln!(
                out,
                "{:<width$} {:<36} {:<8} {test}",
                part.part,
                names(&part.needs),
                result
            );
        }
        let _ = writeln!(out);
        if self.ok {
            let _ = writeln!(out, "Everything the enabled parts need is present.");
        } else {
            let failed: Vec<String> = self.parts.iter().filter_map(PartCheck::failure).collect();
            let _ = writeln!(
                out,
                "Not ready: {} of {} parts:",
                failed.len(),
                self.parts.len()
            );
            for line in failed {
                let _ = writeln!(out, "  {line}");
            }
        }
        if !self.needed.is_empty() {
            let _ = writeln!(
                out,
                "To grant what they need ({}), either:",
                names(&self.needed)
            );
            let _ = writeln!(out, "  {}", self.fix.setcap);
            let _ = writeln!(out, "or, in the systemd unit ([Service]):");
            for l in &self.fix.systemd {
                let _ = writeln!(out, "  {l}");
            }
            if !self.fix.sudoers.is_empty() {
                let _ = writeln!(
                    out,
                    "or, with --security.drop-privileges=false (sudo is set-uid, which no-new-privs blocks), in sudoers:"
                );
                for l in &self.fix.sudoers {
                    let _ = writeln!(out, "  {l}");
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fix_lines() {
        let f = fix(
            &[Capability::CAP_DAC_READ_SEARCH, Capability::CAP_SYS_PTRACE],
            Path::new("/usr/bin/ceems"),
            &["/usr/sbin/ipmi-dcmi".to_owned()],
        );
        assert_eq!(
            f.setcap,
            "setcap 'cap_dac_read_search,cap_sys_ptrace=p' /usr/bin/ceems"
        );
        assert_eq!(
            f.systemd,
            [
                "AmbientCapabilities=CAP_DAC_READ_SEARCH CAP_SYS_PTRACE",
                "CapabilityBoundingSet=CAP_DAC_READ_SEARCH CAP_SYS_PTRACE"
            ]
        );
        assert_eq!(
            f.sudoers,
            ["ceems ALL=(root) NOPASSWD: /usr/sbin/ipmi-dcmi"]
        );
    }

    #[test]
    fn outcomes_from_os_errors() {
        let t = |e: io::Error| OperationTest::from_io("x".into(), Err(e)).outcome;
        assert_eq!(
            t(io::Error::from_raw_os_error(nix::libc::EACCES)),
            TestOutcome::Denied
        );
        assert_eq!(
            t(io::Error::from_raw_os_error(nix::libc::EPERM)),
            TestOutcome::Denied
        );
        assert_eq!(
            t(io::Error::from_raw_os_error(nix::libc::ENOENT)),
            TestOutcome::NotPresent
        );
        assert_eq!(
            t(io::Error::from_raw_os_error(nix::libc::EIO)),
            TestOutcome::Error
        );
    }
}
