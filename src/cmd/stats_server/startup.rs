//! What the stats-server checks before it serves: its Prometheus URLs, its data directory,
//! and that no other server uses that directory.

use anyhow::Context;

use crate::store::prometheus::HttpPrometheus;

/// A Prometheus URL that cannot work is refused at start, not warned about at each update;
/// clusters without one get no usage figures, which is said once.
pub(super) fn check_prometheus_urls(
    clusters: &[super::settings::ClusterSettings],
    default_url: &str,
) -> anyhow::Result<()> {
    let mut without = Vec::new();
    for c in clusters {
        match c.prometheus_url.as_deref().unwrap_or(default_url) {
            "" => without.push(c.id.as_str()),
            url => HttpPrometheus::check_url(url).map_err(|e| {
                let key = match c.prometheus_url {
                    Some(_) => format!("clusters: `{}`: prometheus-url", c.id),
                    None => "--prometheus.url".to_owned(),
                };
                anyhow::anyhow!("{key}: {e}")
            })?,
        }
    }
    if !without.is_empty() {
        tracing::warn!(
            clusters = ?without,
            "no Prometheus URL (--prometheus.url, or a cluster's prometheus-url): these clusters' units get no CPU, memory, energy or emissions figures"
        );
    }
    Ok(())
}

/// The file a running stats-server holds locked in its data directory, with its PID in it.
pub const SERVER_LOCK: &str = "stats-server.lock";

/// Locks `dir` for this server, or says which process holds it.
pub(super) fn lock_data_dir(
    dir: &std::path::Path,
) -> anyhow::Result<nix::fcntl::Flock<std::fs::File>> {
    use std::io::{Read, Seek, Write};
    let path = dir.join(SERVER_LOCK);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let mut lock = match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
    {
        Ok(lock) => lock,
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            anyhow::bail!(
                "another stats-server (pid {}) uses {}: one server per SQLite directory (give this one another --storage.data.path, or share PostgreSQL with --storage.database-url)",
                match pid.trim() {
                    "" => "unknown",
                    p => p,
                },
                dir.display()
            );
        }
        Err((_, e)) => anyhow::bail!("cannot lock {}: {e}", path.display()),
    };
    lock.set_len(0)?;
    lock.rewind()?;
    writeln!(lock, "{}", std::process::id())?;
    Ok(lock)
}

/// The SQLite database's directory, created as the user the server runs as (so the file is
/// theirs) and writable by them.
pub(super) fn check_data_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| {
        format!(
            "cannot create {} as uid {}",
            dir.display(),
            nix::unistd::getuid()
        )
    })?;
    if let Err(e) = nix::unistd::access(
        dir,
        nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
    ) {
        anyhow::bail!(
            "{} is not writable by uid {} ({e}): give it to that user, or set --security.run-as-user",
            dir.display(),
            nix::unistd::getuid()
        );
    }
    Ok(())
}

/// The server's own directories must be directories: a file in the way is named as such,
/// not as "File exists" from an attempt to create it.
pub(super) fn refuse_files(dirs: &[&std::path::Path]) -> anyhow::Result<()> {
    for dir in dirs {
        if dir.exists() && !dir.is_dir() {
            anyhow::bail!(
                "{} is not a directory (--storage.data.path and --storage.data.backup.path name directories)",
                dir.display()
            );
        }
    }
    Ok(())
}

/// check-privileges' test of the SQLite directory, run as the daemon runs (privileges already
/// dropped): one this user can write, with a database file it can write, or one the daemon
/// creates for it at start (`created_at_start`: it starts as root and drops privileges).
pub fn test_data_dir(
    dir: &std::path::Path,
    created_at_start: bool,
) -> crate::security::check::OperationTest {
    use crate::security::check::{OperationTest, TestOutcome};
    use nix::unistd::{access, AccessFlags};
    let operation = format!("write the database in {}", dir.display());
    let result = |outcome, error: Option<String>| OperationTest {
        operation: operation.clone(),
        outcome,
        error,
    };
    let uid = nix::unistd::getuid();
    let owner = |p: &std::path::Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).map_or_else(
            |_| String::new(),
            |m| format!(" (owner uid {}, mode {:04o})", m.uid(), m.mode() & 0o7777),
        )
    };
    if dir.exists() && !dir.is_dir() {
        return result(
            TestOutcome::Error,
            Some(format!("{} is not a directory", dir.display())),
        );
    }
    if !dir.exists() {
        if created_at_start {
            return result(TestOutcome::Ok, None);
        }
        let Some(above) = dir.ancestors().find(|p| p.exists()) else {
            return result(TestOutcome::Error, Some("no existing parent".into()));
        };
        return match access(above, AccessFlags::W_OK | AccessFlags::X_OK) {
            Ok(()) => result(TestOutcome::Ok, None),
            Err(e) => result(
                TestOutcome::Denied,
                Some(format!(
                    "{} does not exist and uid {uid} cannot create it in {}{} ({e}): create it for that user",
                    dir.display(),
                    above.display(),
                    owner(above)
                )),
            ),
        };
    }
    let db = dir.join("ceems.db");
    for (path, flags) in [
        (dir, AccessFlags::W_OK | AccessFlags::X_OK),
        (db.as_path(), AccessFlags::R_OK | AccessFlags::W_OK),
    ] {
        if path != dir && !path.exists() {
            continue;
        }
        if let Err(e) = access(path, flags) {
            return result(
                TestOutcome::Denied,
                Some(format!(
                    "{} is not writable by uid {uid}{} ({e}): give it to the user the server runs as (--security.run-as-user)",
                    path.display(),
                    owner(path)
                )),
            );
        }
    }
    result(TestOutcome::Ok, None)
}
