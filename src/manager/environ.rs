//! What a job's own processes say in their environment: the first of `vars` set in a process
//! whose `id_var` is the job's id. A process of another job can sit in a job's cgroup (seen
//! in CEEMS's fixtures), so only the job's own count. Other users' `environ` files need
//! CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH: callers read them in `security::privileged`.

use std::path::Path;

use crate::host::procfs::environ_var;

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
