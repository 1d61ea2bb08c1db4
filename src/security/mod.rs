//! The privilege helper. Started as root (or with file or ambient capabilities), a daemon keeps
//! only the capabilities its enabled parts declare, in the permitted set, and runs as an
//! unprivileged user with an empty effective set. Capabilities are per thread, so no async
//! worker ever holds one: an operation that needs one runs on a thread that raised it, either a
//! long-lived worker per capability set ([`privileged`], for reads and opens) or a short-lived
//! thread ([`with_capabilities`], for starting a program, so that no long-lived thread forks
//! with a capability raised).

use std::collections::HashSet;
use std::io;
use std::sync::{mpsc, Mutex};

pub mod check;

use caps::{CapSet, Capability, CapsHashSet};
use serde::Deserialize;

use crate::config::{Kind, Opt};

/// `--security.*` options, shared by the daemons.
pub fn opts() -> Vec<Opt> {
    vec![
        Opt::new(
            "security.drop-privileges",
            Kind::Flag,
            "Run as --security.run-as-user with only the capabilities the enabled collectors need (turn off to debug)",
        )
        .default("true"),
        Opt::new(
            "security.run-as-user",
            Kind::Str,
            "User (name or uid) to run as when started as root (default: nobody)",
        ),
    ]
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SecuritySettings {
    pub drop_privileges: bool,
    #[serde(default)]
    pub run_as_user: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    #[error("the privilege helper must run before any thread starts; {0} threads are running")]
    Threads(usize),
    #[error("no such user `{0}` (--security.run-as-user)")]
    NoUser(String),
    #[error("--security.run-as-user needs the process to start as root")]
    NotRoot,
    #[error("{what}: {source}")]
    Sys {
        what: &'static str,
        source: nix::errno::Errno,
    },
    #[error("cannot create {path} for uid {uid}: {source}")]
    Dir {
        path: std::path::PathBuf,
        uid: u32,
        source: io::Error,
    },
    #[error("{what}: {source}")]
    Caps {
        what: &'static str,
        source: caps::errors::CapsError,
    },
}

/// What the helper did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// `--security.drop-privileges=false`.
    Disabled,
    /// Started unprivileged with no capabilities: nothing to drop.
    Unprivileged,
    /// Running as `uid` with these permitted capabilities; `missing` were needed but not held.
    Dropped {
        uid: u32,
        kept: Vec<Capability>,
        missing: Vec<Capability>,
    },
}

impl Outcome {
    /// Says in the log what the helper did for `subcommand`.
    pub fn log(&self, subcommand: &str) {
        match self {
            Outcome::Disabled => {
                tracing::warn!("privileges not dropped (--security.drop-privileges=false)")
            }
            Outcome::Unprivileged => tracing::info!("started unprivileged; nothing to drop"),
            Outcome::Dropped { uid, kept, missing } => {
                tracing::info!(uid, capabilities = ?kept, "dropped privileges");
                if !missing.is_empty() {
                    tracing::warn!(
                        capabilities = ?missing,
                        "enabled parts need capabilities this process does not have; run `ceems check-privileges {subcommand}` to see what fails"
                    );
                }
            }
        }
    }
}

fn sys(what: &'static str) -> impl FnOnce(nix::errno::Errno) -> SecurityError {
    move |source| SecurityError::Sys { what, source }
}

fn capserr(what: &'static str) -> impl FnOnce(caps::errors::CapsError) -> SecurityError {
    move |source| SecurityError::Caps { what, source }
}

/// Threads of this process, from /proc/self/status.
fn thread_count() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(1)
}

fn resolve_user(spec: &str) -> Result<nix::unistd::User, SecurityError> {
    let found = match spec.parse::<u32>() {
        Ok(uid) => nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)),
        Err(_) => nix::unistd::User::from_name(spec),
    };
    found
        .ok()
        .flatten()
        .ok_or_else(|| SecurityError::NoUser(spec.to_owned()))
}

/// Sorted, for stable logs and output.
pub fn sorted(set: impl IntoIterator<Item = Capability>) -> Vec<Capability> {
    let mut v: Vec<Capability> = set.into_iter().collect();
    v.sort_by_key(|c| c.index());
    v.dedup();
    v
}

/// Drops to `settings.run_as_user` (nobody by default) when root, and keeps only `needed` in
/// the permitted set, with the effective, inheritable and ambient sets empty and no-new-privs
/// set. Must run before any other thread exists: setuid and capsets act per thread.
pub fn drop_privileges(
    settings: &SecuritySettings,
    needed: &[Capability],
) -> Result<Outcome, SecurityError> {
    if !settings.drop_privileges {
        return Ok(Outcome::Disabled);
    }
    let threads = thread_count();
    if threads > 1 {
        return Err(SecurityError::Threads(threads));
    }
    let root = nix::unistd::geteuid().is_root();
    let permitted = caps::read(None, CapSet::Permitted).map_err(capserr("reading capabilities"))?;
    if !root {
        if settings.run_as_user.is_some() {
            return Err(SecurityError::NotRoot);
        }
        if permitted.is_empty() {
            return Ok(Outcome::Unprivileged);
        }
    }
    if root {
        let user = resolve_user(settings.run_as_user.as_deref().unwrap_or("nobody"))?;
        // Keep the permitted set across the uid change; the kernel clears the effective set.
        nix::sys::prctl::set_keepcaps(true).map_err(sys("PR_SET_KEEPCAPS"))?;
        nix::unistd::setgroups(&[user.gid]).map_err(sys("setgroups"))?;
        nix::unistd::setresgid(user.gid, user.gid, user.gid).map_err(sys("setresgid"))?;
        nix::unistd::setresuid(user.uid, user.uid, user.uid).map_err(sys("setresuid"))?;
        nix::sys::prctl::set_keepcaps(false).map_err(sys("PR_SET_KEEPCAPS"))?;
    }
    let held = caps::read(None, CapSet::Permitted).map_err(capserr("reading capabilities"))?;
    let wanted: CapsHashSet = needed.iter().copied().collect();
    let kept: CapsHashSet = held.intersection(&wanted).copied().collect();
    let missing: HashSet<Capability> = wanted.difference(&held).copied().collect();
    caps::clear(None, CapSet::Ambient).map_err(capserr("clearing ambient capabilities"))?;
    caps::clear(None, CapSet::Effective).map_err(capserr("clearing effective capabilities"))?;
    caps::clear(None, CapSet::Inheritable).map_err(capserr("clearing inheritable capabilities"))?;
    caps::set(None, CapSet::Permitted, &kept)
        .map_err(capserr("limiting permitted capabilities"))?;
    nix::sys::prctl::set_no_new_privs().map_err(sys("PR_SET_NO_NEW_PRIVS"))?;
    Ok(Outcome::Dropped {
        uid: nix::unistd::getuid().as_raw(),
        kept: sorted(kept),
        missing: sorted(missing),
    })
}

/// Whether this process runs with ids its file granted (a setuid or setgid program such as
/// `cacct`): its effective user or group is not the caller's.
pub fn set_id() -> bool {
    nix::unistd::geteuid() != nix::unistd::getuid()
        || nix::unistd::getegid() != nix::unistd::getgid()
}

/// Gives up, for good, the user and group a setuid or setgid file granted: every id becomes
/// the caller's. What the program read with them (its protected config) stays read; nothing
/// after this (requests, files it writes) runs with them.
pub fn drop_set_id() -> Result<(), SecurityError> {
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    nix::unistd::setresgid(gid, gid, gid).map_err(sys("setresgid"))?;
    nix::unistd::setresuid(uid, uid, uid).map_err(sys("setresuid"))?;
    Ok(())
}

/// Creates each missing directory of `dirs`, and its missing parents, owned by the user
/// [`drop_privileges`] will switch to, so that a first start as root does not stop at
/// "permission denied" once it runs as that user. Directories that exist are left as they are.
/// Does nothing unless the process is root and drops privileges. Returns what it created.
pub fn create_dirs_for_run_as_user(
    settings: &SecuritySettings,
    dirs: &[&std::path::Path],
) -> Result<Vec<std::path::PathBuf>, SecurityError> {
    use std::os::unix::fs::DirBuilderExt;
    if !settings.drop_privileges || !nix::unistd::geteuid().is_root() {
        return Ok(Vec::new());
    }
    let user = resolve_user(settings.run_as_user.as_deref().unwrap_or("nobody"))?;
    let mut created = Vec::new();
    for dir in dirs {
        let mut missing: Vec<&std::path::Path> = dir
            .ancestors()
            .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
            .collect();
        missing.reverse();
        let fail = |path: &std::path::Path, source| SecurityError::Dir {
            path: path.to_path_buf(),
            uid: user.uid.as_raw(),
            source,
        };
        // Job data: readable by the service user only.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .map_err(|e| fail(dir, e))?;
        for path in missing {
            nix::unistd::chown(path, Some(user.uid), Some(user.gid))
                .map_err(|e| fail(path, e.into()))?;
            created.push(path.to_path_buf());
        }
    }
    Ok(created)
}

/// Runs `f` with `needed` raised in the effective set. When this thread lacks them but holds
/// them in its permitted set, `f` runs on a new OS thread that raises them and exits: for
/// starting a program (as another user, say). Reads and opens go through [`privileged`].
/// Otherwise (root without dropping, or no permission at all) `f` runs here and meets whatever
/// the OS says.
pub fn with_capabilities<T: Send>(needed: &[Capability], f: impl FnOnce() -> T + Send) -> T {
    with_raised(needed, false, f)
}

/// As [`with_capabilities`], and the capabilities are also put in the ambient set, so that a
/// program `f` starts (not set-uid) runs with them: how an IPMI tool reads `/dev/ipmi0`.
pub fn with_capabilities_for_child<T: Send>(
    needed: &[Capability],
    f: impl FnOnce() -> T + Send,
) -> T {
    with_raised(needed, true, f)
}

/// The permitted set when this thread lacks some of `needed` and may raise at least one of them;
/// None when `f` should simply run here (root without dropping, or no permission at all).
fn raisable(needed: &[Capability], ambient: bool) -> Option<CapsHashSet> {
    let effective = caps::read(None, CapSet::Effective).unwrap_or_default();
    let permitted = caps::read(None, CapSet::Permitted).unwrap_or_default();
    let have_all = needed.iter().all(|c| effective.contains(c));
    let can_raise = needed
        .iter()
        .any(|c| permitted.contains(c) && !effective.contains(c));
    if needed.is_empty() || (have_all && !ambient) || !can_raise {
        return None;
    }
    Some(permitted)
}

/// Raises those of `needed` that are permitted on the calling thread.
fn raise(needed: &[Capability], permitted: &CapsHashSet, ambient: bool) {
    for c in needed {
        if !permitted.contains(c) {
            continue;
        }
        if let Err(e) = caps::raise(None, CapSet::Effective, *c) {
            tracing::debug!(capability = %c, error = %e, "cannot raise capability");
        }
        if ambient {
            let _ = caps::raise(None, CapSet::Inheritable, *c);
            if let Err(e) = caps::raise(None, CapSet::Ambient, *c) {
                tracing::debug!(capability = %c, error = %e, "cannot raise ambient capability");
            }
        }
    }
}

fn with_raised<T: Send>(needed: &[Capability], ambient: bool, f: impl FnOnce() -> T + Send) -> T {
    let Some(permitted) = raisable(needed, ambient) else {
        return f();
    };
    std::thread::scope(|s| {
        let worker = s.spawn(|| {
            raise(needed, &permitted, ambient);
            f()
        });
        match worker.join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

type Task = Box<dyn FnOnce() + Send>;

/// The long-lived privileged threads, one per capability set, started on first use.
static WORKERS: Mutex<Vec<(Vec<Capability>, mpsc::Sender<Task>)>> = Mutex::new(Vec::new());

fn worker_for(needed: &[Capability], permitted: CapsHashSet) -> io::Result<mpsc::Sender<Task>> {
    let mut workers = WORKERS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, tx)) = workers.iter().find(|(caps, _)| caps.as_slice() == needed) {
        return Ok(tx.clone());
    }
    let (tx, rx) = mpsc::channel::<Task>();
    let caps = needed.to_vec();
    std::thread::Builder::new()
        .name("ceems-privileged".into())
        .spawn(move || {
            raise(&caps, &permitted, false);
            for task in rx {
                task();
            }
        })?;
    workers.push((needed.to_vec(), tx.clone()));
    Ok(tx)
}

/// Runs `f` with `needed` raised in the effective set, on a long-lived thread kept for this
/// capability set: for reads made at every scrape, where starting a thread per read cost more
/// than the read. That thread runs nothing but what is sent here. Without anything to raise
/// (root without dropping, or no permission at all) `f` runs on the calling thread.
pub fn privileged<T: Send + 'static>(
    needed: &[Capability],
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let Some(permitted) = raisable(needed, false) else {
        return f();
    };
    let (done_tx, done_rx) = mpsc::sync_channel(1);
    let task: Task = Box::new(move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = done_tx.send(result);
    });
    let sent = match worker_for(needed, permitted) {
        Ok(tx) => tx.send(task).map_err(|e| e.0),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the privileged thread; using a short-lived one");
            Err(task)
        }
    };
    if let Err(task) = sent {
        with_raised(needed, false, task);
    }
    match done_rx.recv() {
        Ok(Ok(v)) => v,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        // The task ran to the send above or was dropped unrun: only a dead worker drops it.
        Err(_) => panic!("the privileged thread stopped before running its task"),
    }
}

/// The capability sets of this process, for `check-privileges` and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessCaps {
    pub permitted: Vec<Capability>,
    pub effective: Vec<Capability>,
    pub inheritable: Vec<Capability>,
    pub ambient: Vec<Capability>,
    pub bounding: Vec<Capability>,
}

pub fn process_caps() -> io::Result<ProcessCaps> {
    let read = |set| caps::read(None, set).map(sorted).map_err(io::Error::other);
    Ok(ProcessCaps {
        permitted: read(CapSet::Permitted)?,
        effective: read(CapSet::Effective)?,
        inheritable: read(CapSet::Inheritable)?,
        ambient: read(CapSet::Ambient)?,
        bounding: read(CapSet::Bounding)?,
    })
}

/// File capabilities of a binary: its `security.capability` extended attribute.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileCaps {
    pub permitted: Vec<Capability>,
    pub inheritable: Vec<Capability>,
    pub effective: bool,
}

/// Decodes a `security.capability` value (VFS_CAP_REVISION_2 or 3).
pub fn decode_file_caps(data: &[u8]) -> Option<FileCaps> {
    let word = |i: usize| -> Option<u32> {
        Some(u32::from_le_bytes(
            data.get(i * 4..i * 4 + 4)?.try_into().ok()?,
        ))
    };
    let magic = word(0)?;
    let revision = magic & 0xff00_0000;
    // Revision 2 (20 bytes) and 3 (24 bytes, with a root uid) share the first 20.
    if revision != 0x0200_0000 && revision != 0x0300_0000 {
        return None;
    }
    let permitted = u64::from(word(1)?) | (u64::from(word(3)?) << 32);
    let inheritable = u64::from(word(2)?) | (u64::from(word(4)?) << 32);
    let set = |bits: u64| {
        sorted(
            caps::all()
                .into_iter()
                .filter(|c| c.index() < 64 && bits & (1u64 << c.index()) != 0),
        )
    };
    Some(FileCaps {
        permitted: set(permitted),
        inheritable: set(inheritable),
        effective: magic & 1 == 1,
    })
}

/// The file capabilities of `path`, or None when it has none.
pub fn file_caps(path: &std::path::Path) -> io::Result<Option<FileCaps>> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::other("path holds a NUL byte"))?;
    let mut buf = [0u8; 64];
    // SAFETY: the path is NUL-terminated, the buffer is ours and its length is passed.
    let n = unsafe {
        nix::libc::getxattr(
            c_path.as_ptr(),
            c"security.capability".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(nix::libc::ENODATA) | Some(nix::libc::ENOTSUP) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(decode_file_caps(&buf[..n as usize]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_capability_attributes() {
        // `setcap cap_dac_read_search,cap_sys_ptrace+ep`: revision 2, effective bit set.
        let mut v2 = Vec::new();
        v2.extend_from_slice(&(0x0200_0000u32 | 1).to_le_bytes());
        let bits: u32 = (1 << 2) | (1 << 19);
        v2.extend_from_slice(&bits.to_le_bytes());
        v2.extend_from_slice(&0u32.to_le_bytes());
        v2.extend_from_slice(&0u32.to_le_bytes());
        v2.extend_from_slice(&0u32.to_le_bytes());
        let caps = decode_file_caps(&v2).unwrap();
        assert!(caps.effective);
        assert_eq!(
            caps.permitted,
            vec![Capability::CAP_DAC_READ_SEARCH, Capability::CAP_SYS_PTRACE]
        );
        assert!(caps.inheritable.is_empty());
        assert_eq!(decode_file_caps(&v2[..10]), None);
        assert_eq!(decode_file_caps(&[0u8; 20]), None);
    }

    #[test]
    fn raising_without_permission_runs_in_place() {
        // No capability to raise that is not held already: no thread, same result.
        let here = std::thread::current().id();
        let ran_on = with_capabilities(&[], || std::thread::current().id());
        assert_eq!(ran_on, here);
        assert_eq!(privileged(&[], || std::thread::current().id()), here);
    }

    #[test]
    fn privileged_reads_run_on_one_long_lived_thread_with_the_capability() {
        if !nix::unistd::geteuid().is_root() {
            println!("SKIPPED: needs root to hold capabilities");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "42").unwrap();
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o000))
            .unwrap();
        // This test's thread becomes what a dropped daemon's threads are: capabilities
        // permitted, none effective.
        let before = caps::read(None, CapSet::Effective).unwrap();
        caps::clear(None, CapSet::Effective).unwrap();
        let here = std::fs::read(&secret).map_err(|e| e.kind());
        let needed = [Capability::CAP_DAC_READ_SEARCH];
        let read = |path: std::path::PathBuf| {
            privileged(&needed, move || {
                (std::thread::current().id(), std::fs::read(path).ok())
            })
        };
        let (first, got) = read(secret.clone());
        let (second, again) = read(secret.clone());
        let panicked = std::panic::catch_unwind(|| privileged(&needed, || panic!("in the task")));
        let (third, _) = read(secret.clone());
        caps::set(None, CapSet::Effective, &before).unwrap();

        assert_eq!(here, Err(io::ErrorKind::PermissionDenied));
        assert_eq!(got.as_deref(), Some(&b"42"[..]));
        assert_eq!(again.as_deref(), Some(&b"42"[..]));
        assert_ne!(first, std::thread::current().id());
        assert_eq!(first, second, "one thread serves every read");
        assert!(panicked.is_err(), "a panic reaches the caller");
        assert_eq!(third, first, "the thread outlives a panicking task");
    }
}
