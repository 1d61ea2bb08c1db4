//! Running an external tool (IPMI tools, capmc, …) with a deadline: a hung tool is killed with
//! its whole process group, and its output is capped.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// At most this much stdout is kept; the tools print a few hundred bytes.
const MAX_OUTPUT: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("{program} did not finish within {timeout:?} and was killed")]
    Timeout { program: String, timeout: Duration },
    #[error("{program} exited with {status}: {stderr}")]
    Failed {
        program: String,
        status: std::process::ExitStatus,
        stderr: String,
        /// What it printed before failing: some tools list what they could and exit 1.
        stdout: String,
    },
    #[error("{program} printed more than {limit} bytes")]
    TooMuchOutput { program: String, limit: u64 },
    #[error("{program} printed a line longer than {limit} bytes")]
    LineTooLong { program: String, limit: usize },
    #[error("waiting for {program}: {source}")]
    Wait {
        program: String,
        source: std::io::Error,
    },
}

/// Reads a pipe to its end, keeping at most `cap` bytes; says whether there was more.
fn drain(mut r: impl Read + Send + 'static, cap: u64) -> std::thread::JoinHandle<(Vec<u8>, bool)> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = (&mut r).take(cap).read_to_end(&mut buf);
        // Keep reading past the cap so the tool never blocks on a full pipe.
        let more = std::io::copy(&mut r, &mut std::io::sink()).unwrap_or(0);
        (buf, more > 0)
    })
}

/// Runs `program args…` and returns its stdout. Non-zero exit, a timeout or a failure to start
/// are errors that name the program.
pub fn run(program: &Path, args: &[String], timeout: Duration) -> Result<String, CommandError> {
    run_env(program, args, &[], timeout, MAX_OUTPUT)
}

/// As [`run`], with extra environment variables and another output limit: more output than
/// `max_output` is an error, never a silently cut answer.
pub fn run_env(
    program: &Path,
    args: &[String],
    env: &[(&str, &str)],
    timeout: Duration,
    max_output: u64,
) -> Result<String, CommandError> {
    run_as(program, args, env, timeout, max_output, None)
}

/// As [`run_env`], and the child switches to `user` (uid, gid) before it executes `program`:
/// the calling thread must then hold CAP_SETUID and CAP_SETGID in its effective set (see
/// `security::with_capabilities`); the program itself starts with none.
pub fn run_as(
    program: &Path,
    args: &[String],
    env: &[(&str, &str)],
    timeout: Duration,
    max_output: u64,
    user: Option<(u32, u32)>,
) -> Result<String, CommandError> {
    let name = program.display().to_string();
    let mut child = spawn_as(program, args, env, user)?;
    let out = child.stdout.take().map(|s| drain(s, max_output));
    let err = child.stderr.take().map(|s| drain(s, 4096));
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                // The whole group, so that a shell wrapper's children die too.
                let _ = kill_group(&mut child);
                return Err(CommandError::Timeout {
                    program: name,
                    timeout,
                });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(source) => {
                return Err(CommandError::Wait {
                    program: name,
                    source,
                })
            }
        }
    };
    let (stdout, truncated) = out.and_then(|h| h.join().ok()).unwrap_or_default();
    let (stderr, _) = err.and_then(|h| h.join().ok()).unwrap_or_default();
    if truncated {
        return Err(CommandError::TooMuchOutput {
            program: name,
            limit: max_output,
        });
    }
    if !status.success() {
        return Err(CommandError::Failed {
            program: name,
            status,
            stderr: String::from_utf8_lossy(&stderr).trim().to_owned(),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&stdout).into_owned())
}

/// Starts `program args…` in its own process group (so that a timeout kills a wrapper's
/// children too), stdin closed, stdout and stderr piped; the child becomes `user` first.
pub fn spawn_as(
    program: &Path,
    args: &[String],
    env: &[(&str, &str)],
    user: Option<(u32, u32)>,
) -> Result<Child, CommandError> {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(program);
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid);
    }
    command
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|source| CommandError::Spawn {
            program: program.display().to_string(),
            source,
        })
}

/// A started program's stdout, read a line at a time as the caller asks for them, so that a
/// large answer (sacct's window of a million jobs: 180 MB) is never held whole. The program
/// is killed with its group at the deadline, or when the lines are dropped before its end.
pub struct StdoutLines {
    program: String,
    child: Child,
    stdout: BufReader<ChildStdout>,
    stderr: Option<std::thread::JoinHandle<(Vec<u8>, bool)>>,
    /// Told when the output ended; says whether it killed the program first.
    watchdog: Option<(mpsc::Sender<()>, std::thread::JoinHandle<bool>)>,
    timeout: Duration,
    max_line: usize,
    ended: bool,
}

impl StdoutLines {
    /// Reads the output of `child` (started by [`spawn_as`]), which must end within
    /// `timeout`; a line longer than `max_line` bytes is an error.
    pub fn new(
        program: &Path,
        mut child: Child,
        timeout: Duration,
        max_line: usize,
    ) -> Result<StdoutLines, CommandError> {
        let name = program.display().to_string();
        let stderr = child.stderr.take().map(|s| drain(s, 4096));
        let Some(stdout) = child.stdout.take() else {
            let _ = kill_group(&mut child);
            return Err(CommandError::Wait {
                program: name,
                source: std::io::Error::other("its output is not piped"),
            });
        };
        let group = child.id() as i32;
        let (stop, stopped) = mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(timeout) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(group),
                    nix::sys::signal::Signal::SIGKILL,
                );
                return true;
            }
            false
        });
        Ok(StdoutLines {
            program: name,
            child,
            stdout: BufReader::with_capacity(1 << 16, stdout),
            stderr,
            watchdog: Some((stop, watchdog)),
            timeout,
            max_line,
            ended: false,
        })
    }

    /// The next line into `line` (cleared first, without its `\n`): Ok(true) with a line,
    /// Ok(false) once the program ended well after its last one; an error when it failed,
    /// ran past its deadline or printed a line too long.
    pub fn next_line(&mut self, line: &mut Vec<u8>) -> Result<bool, CommandError> {
        if self.ended {
            return Ok(false);
        }
        line.clear();
        let limit = self.max_line as u64 + 1;
        let read = (&mut self.stdout).take(limit).read_until(b'\n', line);
        match read {
            Ok(0) => self.finish().map(|()| false),
            Ok(_) if line.last() == Some(&b'\n') => {
                line.pop();
                Ok(true)
            }
            Ok(n) if n as u64 >= limit => {
                self.abort();
                Err(CommandError::LineTooLong {
                    program: self.program.clone(),
                    limit: self.max_line,
                })
            }
            // The last line, without an end.
            Ok(_) => Ok(true),
            Err(source) => {
                self.abort();
                Err(CommandError::Wait {
                    program: self.program.clone(),
                    source,
                })
            }
        }
    }

    /// After the end of the output: the program's exit, or why it did not end well.
    fn finish(&mut self) -> Result<(), CommandError> {
        self.ended = true;
        // Waited for under the deadline: a program can close its output and stay.
        let status = self.child.wait().map_err(|source| CommandError::Wait {
            program: self.program.clone(),
            source,
        });
        let killed = self.stop_watchdog();
        let status = status?;
        if killed {
            return Err(CommandError::Timeout {
                program: self.program.clone(),
                timeout: self.timeout,
            });
        }
        if !status.success() {
            let (stderr, _) = self
                .stderr
                .take()
                .and_then(|h| h.join().ok())
                .unwrap_or_default();
            return Err(CommandError::Failed {
                program: self.program.clone(),
                status,
                stderr: String::from_utf8_lossy(&stderr).trim().to_owned(),
                stdout: String::new(),
            });
        }
        Ok(())
    }
}

impl StdoutLines {
    /// Stops the watchdog; whether it had killed the program.
    fn stop_watchdog(&mut self) -> bool {
        self.watchdog.take().is_some_and(|(stop, watchdog)| {
            let _ = stop.send(());
            watchdog.join().unwrap_or(false)
        })
    }

    /// Ends the program early: the watchdog first, so that it never signals a group whose
    /// leader was reaped (its id could be another's by then).
    fn abort(&mut self) {
        self.ended = true;
        self.stop_watchdog();
        let _ = kill_group(&mut self.child);
    }
}

impl Drop for StdoutLines {
    fn drop(&mut self) {
        if !self.ended {
            self.abort();
        }
    }
}

/// Kills `child`'s whole group and reaps it.
fn kill_group(child: &mut Child) -> std::io::Result<std::process::ExitStatus> {
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    child.wait()
}

/// Directories that `PATH` of a service often lacks but where IPMI tools live.
pub const SBIN_DIRS: &[&str] = &["/sbin", "/usr/sbin", "/usr/local/sbin"];

/// The directories of a `PATH` value.
pub fn path_dirs(path_var: Option<&std::ffi::OsStr>) -> Vec<PathBuf> {
    path_var
        .map(|p| std::env::split_paths(p).collect())
        .unwrap_or_default()
}

/// The first executable `name` in `dirs`.
pub fn find_in(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter()
        .filter(|d| !d.as_os_str().is_empty())
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

/// The first `name` found in `PATH`, then in [`SBIN_DIRS`].
pub fn find_program(name: &str, path_var: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    let mut dirs = path_dirs(path_var);
    dirs.extend(SBIN_DIRS.iter().map(PathBuf::from));
    find_in(name, &dirs)
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> (PathBuf, Vec<String>) {
        (PathBuf::from("/bin/sh"), vec!["-c".into(), script.into()])
    }

    #[test]
    fn output_exit_codes_and_timeouts() {
        let (p, a) = sh("echo hello");
        assert_eq!(run(&p, &a, Duration::from_secs(5)).unwrap(), "hello\n");
        let (p, a) = sh("echo oops >&2; exit 3");
        let err = run(&p, &a, Duration::from_secs(5)).unwrap_err();
        assert!(err.to_string().contains("oops"), "{err}");
        let (p, a) = sh("sleep 30 & sleep 30");
        let start = Instant::now();
        let err = run(&p, &a, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, CommandError::Timeout { .. }), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
        let (p, a) = sh("head -c 3000 /dev/zero");
        let err = run_env(&p, &a, &[], Duration::from_secs(5), 1000).unwrap_err();
        assert!(matches!(err, CommandError::TooMuchOutput { .. }), "{err}");
        let err = run(Path::new("/nonexistent/tool"), &[], Duration::from_secs(1)).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/tool"), "{err}");
    }

    #[test]
    fn finds_programs_on_path() {
        let tmp = tempfile::tempdir().unwrap();
        let tool = tmp.path().join("ipmitool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        assert_eq!(find_program("ipmitool", Some(tmp.path().as_os_str())), None);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            find_program("ipmitool", Some(tmp.path().as_os_str())),
            Some(tool)
        );
    }
}
