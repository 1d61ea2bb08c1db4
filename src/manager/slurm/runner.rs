//! How the stats-server runs Slurm's accounting commands. `sacct --allusers` shows every job
//! only to root, the slurm user and Slurm operators, so the server tries, in this order:
//! 1. as the slurm user: the child switches uid/gid, with CAP_SETUID/CAP_SETGID raised on a
//!    short-lived thread only while it starts;
//! 2. through `sudo -n`, when a sudoers rule allows the command;
//! 3. as this process's own user, which sees all jobs only if Slurm made it an operator.
//!
//! The choice and why the earlier ones were passed over are logged at start-up.

use std::path::{Path, PathBuf};
use std::time::Duration;

use caps::Capability;

use crate::host::command::{self, CommandError};

/// Capabilities the server keeps so it can start Slurm commands as the slurm user.
pub const CAPABILITIES: &[Capability] = &[Capability::CAP_SETUID, Capability::CAP_SETGID];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunMode {
    /// The child becomes this user.
    AsUser { name: String, uid: u32, gid: u32 },
    /// `sudo -n <command> …`.
    Sudo { sudo: PathBuf },
    /// As this process.
    Native,
}

impl std::fmt::Display for RunMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunMode::AsUser { name, uid, .. } => write!(f, "as user {name} (uid {uid})"),
            RunMode::Sudo { sudo } => write!(f, "through {} -n", sudo.display()),
            RunMode::Native => write!(f, "as this process's user"),
        }
    }
}

/// What the choice looks at, gathered by [`Facts::of_process`] or built by tests.
pub struct Facts {
    pub euid: u32,
    /// CAP_SETUID and CAP_SETGID both in the permitted set.
    pub can_switch: bool,
    /// The slurm user's name, uid and primary gid, if it exists.
    pub slurm_user: Option<(String, u32, u32)>,
    pub wanted_user: String,
    /// `sudo`, when found on PATH.
    pub sudo: Option<PathBuf>,
}

impl Facts {
    pub fn of_process(wanted_user: &str) -> Facts {
        let permitted = caps::read(None, caps::CapSet::Permitted).unwrap_or_default();
        let slurm_user = match wanted_user.parse::<u32>() {
            Ok(uid) => nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)),
            Err(_) => nix::unistd::User::from_name(wanted_user),
        }
        .ok()
        .flatten()
        .map(|u| (u.name, u.uid.as_raw(), u.gid.as_raw()));
        Facts {
            euid: nix::unistd::geteuid().as_raw(),
            can_switch: CAPABILITIES.iter().all(|c| permitted.contains(c)),
            slurm_user,
            wanted_user: wanted_user.to_owned(),
            sudo: command::find_program("sudo", std::env::var_os("PATH").as_deref()),
        }
    }
}

/// Picks how to run Slurm commands. `sudo_works` tries `sudo -n` on a harmless command.
pub fn choose(facts: &Facts, sudo_works: impl FnOnce(&Path) -> bool) -> (RunMode, Vec<String>) {
    let mut why = Vec::new();
    match &facts.slurm_user {
        Some((_, uid, _)) if *uid == facts.euid => {
            why.push(format!("already running as {}", facts.wanted_user));
            return (RunMode::Native, why);
        }
        Some((name, uid, gid)) if facts.can_switch || facts.euid == 0 => {
            why.push(format!(
                "holds CAP_SETUID and CAP_SETGID: runs them as {name}"
            ));
            return (
                RunMode::AsUser {
                    name: name.clone(),
                    uid: *uid,
                    gid: *gid,
                },
                why,
            );
        }
        Some(_) => why.push(format!(
            "cannot run as {} without CAP_SETUID and CAP_SETGID",
            facts.wanted_user
        )),
        None => why.push(format!("no user `{}` on this host", facts.wanted_user)),
    }
    match &facts.sudo {
        Some(sudo) if sudo_works(sudo) => {
            why.push("sudo -n allows the command".to_owned());
            return (RunMode::Sudo { sudo: sudo.clone() }, why);
        }
        Some(_) => why.push("sudo -n is not allowed (no sudoers rule, or no-new-privs)".to_owned()),
        None => why.push("no sudo".to_owned()),
    }
    why.push(
        "running natively: sacct shows every user's jobs only to root, the slurm user and Slurm operators"
            .to_owned(),
    );
    (RunMode::Native, why)
}

/// A Slurm command run with a mode, a deadline and an output limit.
#[derive(Debug, Clone)]
pub struct SlurmCommand {
    pub path: PathBuf,
    pub mode: RunMode,
    pub timeout: Duration,
    /// The cluster's own variables (`SLURM_CONF=…`, CEEMS's `cli.environment_variables`),
    /// set for each run; a run's own variables come after them.
    pub env: Vec<(String, String)>,
}

/// What to start for one run of a Slurm command.
struct Invocation<'a> {
    program: &'a Path,
    args: Vec<String>,
    env: Vec<(&'a str, &'a str)>,
    user: Option<(u32, u32)>,
}

impl SlurmCommand {
    /// Runs the command and returns its whole stdout, at most `max_output` bytes.
    pub fn run(
        &self,
        args: &[String],
        env: &[(&str, &str)],
        max_output: u64,
    ) -> Result<String, CommandError> {
        let call = self.invocation(args, env);
        let run = || {
            command::run_as(
                call.program,
                &call.args,
                &call.env,
                self.timeout,
                max_output,
                call.user,
            )
        };
        match call.user {
            // Only the start needs the capabilities, but the start is inside the run.
            Some(_) => crate::security::with_capabilities(CAPABILITIES, run),
            None => run(),
        }
    }

    /// Starts the command and reads its stdout a line at a time (none longer than
    /// `max_line`): sacct's window can be hundreds of megabytes.
    pub fn stream(
        &self,
        args: &[String],
        env: &[(&str, &str)],
        max_line: usize,
    ) -> Result<command::StdoutLines, CommandError> {
        let call = self.invocation(args, env);
        let spawn = || command::spawn_as(call.program, &call.args, &call.env, call.user);
        let child = match call.user {
            Some(_) => crate::security::with_capabilities(CAPABILITIES, spawn),
            None => spawn(),
        }?;
        command::StdoutLines::new(call.program, child, self.timeout, max_line)
    }

    fn invocation<'a>(&'a self, args: &[String], env: &[(&'a str, &'a str)]) -> Invocation<'a> {
        let mut all: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        all.extend_from_slice(env);
        match &self.mode {
            RunMode::Native => Invocation {
                program: &self.path,
                args: args.to_vec(),
                env: all,
                user: None,
            },
            RunMode::Sudo { sudo } => {
                // sudo resets the environment; pass ours as VAR=value arguments.
                let mut full = vec!["-n".to_owned()];
                full.extend(all.iter().map(|(k, v)| format!("{k}={v}")));
                full.push(self.path.display().to_string());
                full.extend(args.iter().cloned());
                Invocation {
                    program: sudo,
                    args: full,
                    env: Vec::new(),
                    user: None,
                }
            }
            RunMode::AsUser { uid, gid, .. } => Invocation {
                program: &self.path,
                args: args.to_vec(),
                env: all,
                user: Some((*uid, *gid)),
            },
        }
    }
}

/// Tries `sudo -n <program> --version`.
pub fn sudo_allows(sudo: &Path, program: &Path) -> bool {
    command::run(
        sudo,
        &[
            "-n".to_owned(),
            program.display().to_string(),
            "--version".to_owned(),
        ],
        Duration::from_secs(10),
    )
    .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(euid: u32, can_switch: bool, slurm: Option<u32>, sudo: bool) -> Facts {
        Facts {
            euid,
            can_switch,
            slurm_user: slurm.map(|uid| ("slurm".to_owned(), uid, uid)),
            wanted_user: "slurm".to_owned(),
            sudo: sudo.then(|| PathBuf::from("/usr/bin/sudo")),
        }
    }

    #[test]
    fn the_slurm_user_comes_first_then_sudo_then_native() {
        let (mode, _) = choose(&facts(65534, true, Some(64030), true), |_| true);
        assert_eq!(
            mode,
            RunMode::AsUser {
                name: "slurm".into(),
                uid: 64030,
                gid: 64030
            }
        );
        let (mode, why) = choose(&facts(65534, false, Some(64030), true), |_| true);
        assert!(matches!(mode, RunMode::Sudo { .. }));
        assert!(why[0].contains("CAP_SETUID"), "{why:?}");
        let (mode, why) = choose(&facts(65534, false, Some(64030), true), |_| false);
        assert_eq!(mode, RunMode::Native);
        assert!(
            why.iter().any(|w| w.contains("sudo -n is not allowed")),
            "{why:?}"
        );
        let (mode, why) = choose(&facts(65534, true, None, false), |_| true);
        assert_eq!(mode, RunMode::Native);
        assert!(why[0].contains("no user `slurm`"), "{why:?}");
        // Already the slurm user: nothing to switch.
        let (mode, _) = choose(&facts(64030, true, Some(64030), true), |_| true);
        assert_eq!(mode, RunMode::Native);
    }

    #[test]
    fn sudo_gets_the_environment_as_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let fake_sudo = dir.path().join("sudo");
        std::fs::write(&fake_sudo, "#!/bin/sh\nprintf '%s\\n' \"$*\"\n").unwrap();
        std::fs::set_permissions(
            &fake_sudo,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let cmd = SlurmCommand {
            path: PathBuf::from("/usr/bin/sacct"),
            mode: RunMode::Sudo { sudo: fake_sudo },
            timeout: Duration::from_secs(5),
            env: vec![("SLURM_CONF".into(), "/etc/slurm/b.conf".into())],
        };
        let out = cmd
            .run(&["-X".to_owned()], &[("SLURM_TIME_FORMAT", "%s")], 1024)
            .unwrap();
        // The cluster's variables, then the run's.
        assert_eq!(
            out.trim(),
            "-n SLURM_CONF=/etc/slurm/b.conf SLURM_TIME_FORMAT=%s /usr/bin/sacct -X"
        );
    }
}
