//! What a job's own processes say in their environment: the first of `vars` set in a process
//! whose `id_var` is the job's id. A process of another job can sit in a job's cgroup (seen
//! in CEEMS's fixtures), so only the job's own count. Other users' `environ` files need
//! CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH: callers read them in `security::privileged`.

use std::path::Path;

use crate::collect::Capability;
use crate::host::cgroup::subtree;
use crate::host::procfs::environ_var;
use crate::manager::UnitCgroup;

/// The value of the first of `vars` in the first of `pids` whose `id_var` is `id`; None when
/// no such process can be read or sets none of them.
pub fn job_environ_value(
    procfs: &Path,
    pids: &[u32],
    id_var: &str,
    id: &str,
    vars: &[&str],
) -> Option<String> {
    for pid in pids {
        let Ok(environ) = std::fs::read(procfs.join(pid.to_string()).join("environ")) else {
            continue;
        };
        if environ_var(&environ, id_var) != Some(id.as_bytes()) {
            continue;
        }
        let value = vars.iter().find_map(|v| environ_var(&environ, v));
        if let Some(text) = value.and_then(|v| std::str::from_utf8(v).ok()) {
            return Some(text.to_owned());
        }
    }
    None
}

/// For each of `units`, [`job_environ_value`] among the processes of its cgroup, read with
/// `caps` raised (on the long-lived thread that holds them), as `(uuid, value)`.
pub fn read_units_environ(
    units: &[&UnitCgroup],
    procfs: &Path,
    caps: &'static [Capability],
    id_var: &'static str,
    vars: &'static [&'static str],
) -> Vec<(String, Option<String>)> {
    if units.is_empty() {
        return Vec::new();
    }
    let mut faults = Vec::new();
    let to_read: Vec<(String, Vec<u32>)> = units
        .iter()
        .map(|u| (u.uuid.clone(), subtree(&u.dir, &mut faults).0))
        .collect();
    let procfs = procfs.to_owned();
    crate::security::privileged(caps, move || {
        to_read
            .into_iter()
            .map(|(uuid, pids)| {
                let value = job_environ_value(&procfs, &pids, id_var, &uuid, vars);
                (uuid, value)
            })
            .collect()
    })
}
