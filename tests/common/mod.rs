//! Helpers shared by the integration tests: run the real binary, scrape it, parse the text.
#![allow(dead_code)]

pub mod bmc;
pub mod browser;
pub mod ceems_pack;
pub mod cgroup;
pub mod http;
pub mod kube_api;
pub mod kubelet;
pub mod lab;
pub mod mail;
pub mod munge;
pub mod tool_pack;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port on 127.0.0.1")
}

/// A child process, killed and reaped when dropped: a failing test leaves nothing running.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

/// A running `ceems exporter`, killed when dropped.
pub struct Running {
    pub child: KillOnDrop,
    pub port: u16,
}

impl Running {
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// Whether it listens: any HTTP answer to /health, a degraded server's 503 included.
    pub fn answers(&self) -> bool {
        matches!(
            ureq::get(&self.url("/health")).call(),
            Ok(_) | Err(ureq::Error::Status(..))
        )
    }

    pub fn get(&self, path: &str) -> String {
        ureq::get(&self.url(path))
            .call()
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
            .into_string()
            .expect("body is not text")
    }
}

/// The value of `name`'s series of unit `uuid`.
pub fn unit_value(series: &BTreeMap<String, f64>, name: &str, uuid: &str) -> Option<f64> {
    series
        .iter()
        .find(|(k, _)| name_of(k) == name && label_of(k, "uuid") == Some(uuid))
        .map(|(_, v)| *v)
}

/// A file holding one number (a cgroup counter).
pub fn read_number(path: &Path) -> f64 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The JSON answer to `GET path` as `user` (in Grafana's user header); any error panics.
pub fn api_get(server: &Running, path: &str, user: &str) -> serde_json::Value {
    let body = ureq::get(&server.url(path))
        .set("X-Grafana-User", user)
        .call()
        .unwrap_or_else(|e| panic!("GET {path} as {user}: {e}"))
        .into_string()
        .expect("body is not text");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {body}"))
}

/// Starts the exporter in `cwd` with `args` on a free port and waits until it answers.
pub fn start_exporter(cwd: &Path, args: &[&str]) -> Running {
    start_exporter_env(cwd, args, &[])
}

/// As [`start_exporter`], with extra environment variables.
pub fn start_exporter_env(
    cwd: &Path,
    args: &[&str],
    env: &[(&str, std::ffi::OsString)],
) -> Running {
    start_subcommand("exporter", cwd, args, env)
}

/// Starts `ceems <subcommand>` with `args` on a free port and waits until its /health answers.
pub fn start_subcommand(
    subcommand: &str,
    cwd: &Path,
    args: &[&str],
    env: &[(&str, std::ffi::OsString)],
) -> Running {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ceems"));
    command
        .envs(env.iter().map(|(k, v)| (k, v)))
        .arg(subcommand)
        .args(args)
        .current_dir(cwd)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    start_listening(command, subcommand)
}

/// Starts `command`, whose arguments end with a ceems subcommand's (it may run ceems through
/// a wrapper that execs it), on a free port and waits until its /health answers.
pub fn start_listening(mut command: Command, what: &str) -> Running {
    let port = free_port();
    let child = command
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .spawn()
        .expect("cannot start ceems");
    let mut running = Running {
        child: KillOnDrop(child),
        port,
    };
    let start = Instant::now();
    loop {
        // Any HTTP answer means it is up (a 401 behind basic auth included).
        if running.answers() {
            return running;
        }
        if let Ok(Some(status)) = running.child.try_wait() {
            panic!("{what} exited at start: {status}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what} did not answer within 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Series of a text exposition: `name{labels}` → value.
pub fn parse_series(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("sample line without a value");
            let value = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse::<f64>().expect("bad sample value"),
            };
            (series.to_owned(), value)
        })
        .collect()
}

/// The metric name of a series key.
pub fn name_of(series: &str) -> &str {
    series.split('{').next().unwrap_or(series)
}

/// The value of `label` in a series key.
pub fn label_of<'a>(series: &'a str, label: &str) -> Option<&'a str> {
    // The whole label name: `uuid` is not the end of `gpuuuid`.
    let start = ['{', ',']
        .iter()
        .filter_map(|sep| {
            let pat = format!("{sep}{label}=\"");
            series.find(&pat).map(|at| at + pat.len())
        })
        .min()?;
    let rest = &series[start..];
    Some(&rest[..rest.find('"')?])
}

/// An executable stand-in for a command-line tool that prints `output` whatever its arguments.
pub fn stub(dir: &Path, name: &str, output: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).expect("stub dir");
    let path = dir.join(name);
    // Absolute paths, so it works with a PATH that holds nothing but stand-ins.
    std::fs::write(
        &path,
        format!("#!/bin/sh\nexec /bin/cat '{}'\n", output.display()),
    )
    .expect("stub");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// Makes sure a test's outside tools are here: already present, or installed from Debian's
/// and PyPI's packages when we are root (as in CI); otherwise says why not.
pub fn ensure_tools(present: impl Fn() -> bool, apt: &[&str], pip: &[&str]) -> Result<(), String> {
    if present() {
        return Ok(());
    }
    if !nix::unistd::Uid::effective().is_root() {
        return Err(format!(
            "{apt:?} {pip:?} missing and we are not root to install them"
        ));
    }
    if !apt.is_empty() {
        let status = Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(apt)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("cannot run apt-get: {e}"))?;
        if !status.success() {
            return Err(format!("apt-get install {apt:?} failed: {status}"));
        }
    }
    if !pip.is_empty() {
        let status = Command::new("python3")
            .args(["-m", "pip", "install", "-q"])
            .args(pip)
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("cannot run pip: {e}"))?;
        if !status.success() {
            return Err(format!("pip install {pip:?} failed: {status}"));
        }
    }
    if present() {
        Ok(())
    } else {
        Err(format!("{apt:?} {pip:?} installed but still not usable"))
    }
}

/// Whether a test whose tools may be missing runs: outside CI it is skipped with the reason,
/// in CI a missing tool is a failure.
/// CEEMS's e2e script's `get`: `curl -k -s ARGS`, the body whatever the status.
pub fn get(args: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-k", "-s"])
        .args(args)
        .output()
        .expect("curl");
    String::from_utf8(out.stdout).expect("curl's output is text")
}

/// CEEMS's e2e script's `waitport`: `curl -s http://localhost:PORT` until any HTTP answer (a
/// TLS port answers plain HTTP with Go's 400), for at most 5 s, then a second more. Panics
/// when nothing answered, where the script would go on to a failing request.
pub fn waitport(port: u16) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        let probe = Command::new("curl")
            .args(["-s", "-o", "/dev/null", &format!("http://localhost:{port}")])
            .status()
            .expect("curl");
        if probe.success() {
            return std::thread::sleep(Duration::from_secs(1));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("nothing answered plain HTTP on :{port} within 5 s, where CEEMS's script waits");
}

pub fn runnable(test: &str, tools: Result<(), String>) -> bool {
    match tools {
        Ok(()) => true,
        Err(reason) if std::env::var_os("CI").is_some() => panic!("{test}: {reason}"),
        Err(reason) => {
            println!("SKIPPED {test}: {reason}");
            false
        }
    }
}
