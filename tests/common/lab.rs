//! The real one-node Slurm cluster (`scripts/slurm-lab.sh`) and Debian's Prometheus, for the
//! end-to-end tests.

use std::path::Path;
use std::process::{Command, Stdio};

use super::KillOnDrop;
use std::time::{Duration, Instant};

/// Brings the lab up (idempotent). Needs root.
pub fn lab() -> Result<(), String> {
    lab_script("slurm-lab.sh")
}

/// Runs one of the labs' set-up scripts (`scripts/<name>`, idempotent). Needs root.
pub fn lab_script(name: &str) -> Result<(), String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err("needs root".into());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(name);
    let out = Command::new("bash")
        .arg(script)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "{name} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// A program a lab daemon runs (a mail program), replaced for a test and put back to `idle`
/// when dropped.
pub struct LabProgram {
    path: &'static str,
    idle: &'static str,
}

impl LabProgram {
    pub fn install(path: &'static str, script: &str, idle: &'static str) -> LabProgram {
        use std::os::unix::fs::PermissionsExt;
        let tmp = format!("{path}.tmp");
        std::fs::write(&tmp, script).expect("write the program");
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::rename(&tmp, path).expect("install the program");
        LabProgram { path, idle }
    }
}

impl Drop for LabProgram {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path, self.idle);
    }
}

/// Runs `cmd` as `user` in /tmp and returns its trimmed stdout.
pub fn as_user(user: &str, cmd: &str) -> String {
    let out = Command::new("su")
        .args([user, "-c", cmd])
        .current_dir("/tmp")
        .output()
        .expect("su");
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Submits `sbatch --parsable <args>` as `user` and returns the job id.
pub fn submit(user: &str, args: &str) -> String {
    let out = as_user(user, &format!("cd /tmp && sbatch --parsable {args}"));
    let job = out.split(';').next().unwrap_or_default().to_owned();
    assert!(
        !job.is_empty() && job.chars().all(|c| c.is_ascii_digit()),
        "job id {job}"
    );
    job
}

pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Debian's prometheus (and promtool), installed when missing and root.
pub fn prometheus_tools() -> Result<(), String> {
    let have = |bin: &str| Command::new(bin).arg("--version").output().is_ok();
    super::ensure_tools(
        || have("prometheus") && have("promtool"),
        &["prometheus"],
        &[],
    )
}

/// A Prometheus on a fresh TSDB, killed when dropped.
pub struct Prometheus {
    _child: KillOnDrop,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scrapes `targets` every second, with `rules` files evaluated every second.
    pub fn start(targets: &[u16], rules: &[&Path]) -> Prometheus {
        Prometheus::start_with(targets, "1s", rules, "")
    }

    /// As [`Prometheus::start`], scraping every `interval`, with `extra` appended to the
    /// configuration (top-level keys).
    pub fn start_with(targets: &[u16], interval: &str, rules: &[&Path], extra: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("prometheus.yml");
        let targets: Vec<String> = targets.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
        let rules: Vec<String> = rules.iter().map(|r| format!("'{}'", r.display())).collect();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n  evaluation_interval: 1s\nrule_files: [{}]\nscrape_configs:\n  - job_name: ceems\n    static_configs:\n      - targets: [{}]\n{extra}",
                rules.join(", "),
                targets.join(", ")
            ),
        )
        .expect("write config");
        let port = super::free_port();
        // A fresh TSDB per run, so no answer comes from an earlier run's data.
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus");
        Prometheus {
            _child: KillOnDrop(child),
            port,
            _dir: dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn get_json(&self, path: &str) -> Option<serde_json::Value> {
        let body = ureq::get(&format!("{}{path}", self.url()))
            .call()
            .ok()?
            .into_string()
            .ok()?;
        serde_json::from_str(&body).ok()
    }

    /// The result vector of an instant query (empty when Prometheus does not answer).
    pub fn query(&self, promql: &str) -> Vec<serde_json::Value> {
        let encoded: String = promql
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        self.get_json(&format!("/api/v1/query?query={encoded}"))
            .and_then(|v| v["data"]["result"].as_array().cloned())
            .unwrap_or_default()
    }

    /// Health of each scrape target, or why there is none yet.
    pub fn targets_up(&self) -> Result<(), String> {
        let targets = self
            .get_json("/api/v1/targets")
            .ok_or("API not answering")?;
        let active = targets["data"]["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if active.is_empty() {
            return Err("no targets yet".into());
        }
        for t in &active {
            if t["health"] != "up" {
                return Err(format!(
                    "target {} health {}: {}",
                    t["scrapeUrl"], t["health"], t["lastError"]
                ));
            }
        }
        Ok(())
    }
}

/// Cancels the jobs when dropped, so a failing test leaves no job behind.
pub struct CancelOnDrop(pub Vec<String>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("scancel").args(&self.0).status();
    }
}

/// Waits until none of `ids` is queued or running.
pub fn wait_jobs_gone(ids: &[String], timeout: Duration) {
    wait_until("the jobs to end", timeout, || {
        let out = Command::new("squeue")
            .args(["-h", "-o", "%i"])
            .output()
            .expect("squeue");
        let queued = String::from_utf8_lossy(&out.stdout);
        !queued.lines().any(|l| ids.contains(&l.trim().to_owned()))
    });
}

/// The stats-server on the lab's cluster `lab`: the real sacct and sacctmgr run as the slurm
/// user, aggregates from `prometheus_url`, an update every 2 s over the last hour, root an
/// admin. The data directory lives as long as the returned guard.
pub fn start_stats_server(prometheus_url: &str) -> (super::Running, tempfile::TempDir) {
    start_stats_server_every(prometheus_url, "2s")
}

/// As [`start_stats_server`], with the periodic update every `interval`.
pub fn start_stats_server_every(
    prometheus_url: &str,
    interval: &str,
) -> (super::Running, tempfile::TempDir) {
    start_stats_server_with(prometheus_url, interval, &[])
}

/// As [`start_stats_server_every`], with `extra` arguments.
pub fn start_stats_server_with(
    prometheus_url: &str,
    interval: &str,
    extra: &[&str],
) -> (super::Running, tempfile::TempDir) {
    let data = tempfile::tempdir().expect("tempdir");
    // The server drops to nobody before it creates its database.
    std::fs::set_permissions(
        data.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .expect("chmod");
    let server = super::start_subcommand(
        "stats-server",
        data.path(),
        &[
            &[
                &format!("--storage.data.path={}", data.path().join("db").display()) as &str,
                &format!("--prometheus.url={prometheus_url}"),
                &format!("--storage.update-interval={interval}"),
                "--storage.first-window=1h",
                "--prometheus.cutoff=5s",
                "--prometheus.scrape-interval=1s",
                // No --slurm.cluster-id: the id is the lab's ClusterName, read from slurm.conf.
                "--slurm.run-as-user=slurm",
                "--web.admin-users=root",
            ],
            extra,
        ]
        .concat(),
        &[],
    );
    (server, data)
}

/// As [`start_stats_server_with`], with `toml` as its config file (bounds of the findings,
/// say); the second guard holds the file.
pub fn start_stats_server_configured(
    prometheus_url: &str,
    interval: &str,
    toml: &str,
) -> (super::Running, tempfile::TempDir, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("ceems.toml");
    std::fs::write(&config, toml).expect("write the config");
    // Read after the server dropped to nobody.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let (server, data) = start_stats_server_with(
        prometheus_url,
        interval,
        &[&format!("--config.file={}", config.display())],
    );
    (server, data, dir)
}

/// One finding of a job, as the API answers it.
#[derive(Debug, Clone)]
pub struct Found {
    pub id: String,
    pub message: String,
    pub advice: String,
}

/// The findings of `job` of cluster `lab` as alice asks for them; none while the job is not
/// stored (or not hers).
pub fn findings_of(server: &super::Running, job: &str) -> Vec<Found> {
    let v: serde_json::Value = ureq::get(&server.url(&format!("/api/v1/units/lab/{job}/findings")))
        .set("X-Grafana-User", "alice")
        .call()
        .ok()
        .and_then(|r| r.into_string().ok())
        .and_then(|body| serde_json::from_str(&body).ok())
        .unwrap_or_default();
    let text = |f: &serde_json::Value, k: &str| f[k].as_str().unwrap_or("").to_owned();
    v["data"]["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| Found {
            id: text(f, "id"),
            message: text(f, "message"),
            advice: text(f, "advice"),
        })
        .collect()
}

/// Debian's Prometheus scraping the exporter on `port` every second, with the project's
/// recording rules, once it has scraped it.
pub fn prometheus_scraping(port: u16) -> Prometheus {
    prometheus_scraping_with(port, "1s", "")
}

/// As [`prometheus_scraping`], every `interval`, with `extra` configuration (a
/// `remote_write` section, say).
pub fn prometheus_scraping_with(port: u16, interval: &str, extra: &str) -> Prometheus {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/prometheus/rules/ceems-host-power.rules.yml");
    let prom = Prometheus::start_with(&[port], interval, &[&rules], extra);
    wait_until(
        "Prometheus scraping the exporter",
        Duration::from_secs(60),
        || prom.targets_up().is_ok(),
    );
    prom
}

/// A Python script that keeps one core busy for its first argument's seconds.
pub const BURNER: &str = "/tmp/ceems-lab-burn.py";

pub fn write_burner() {
    std::fs::write(
        BURNER,
        "import sys, time\nt = time.time()\nwhile time.time() - t < float(sys.argv[1]):\n    pass\n",
    )
    .expect("write the burner");
}

/// Debian's victoria-metrics, installed when missing and root.
pub fn victoria_metrics_tools() -> Result<(), String> {
    super::ensure_tools(
        || {
            Command::new("victoria-metrics")
                .arg("--version")
                .output()
                .is_ok()
        },
        &["victoria-metrics"],
        &[],
    )
}

/// A single-node VictoriaMetrics on fresh storage, killed when dropped; its defaults
/// otherwise, as a site would run it.
pub struct VictoriaMetrics {
    _child: KillOnDrop,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl VictoriaMetrics {
    pub fn start() -> VictoriaMetrics {
        VictoriaMetrics::start_with(&[])
    }

    /// As [`VictoriaMetrics::start`], with `flags` (its limits, say).
    pub fn start_with(flags: &[&str]) -> VictoriaMetrics {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = super::free_port();
        let child = Command::new("victoria-metrics")
            .arg(format!("-storageDataPath={}", dir.path().display()))
            .arg(format!("-httpListenAddr=127.0.0.1:{port}"))
            .arg("-retentionPeriod=1d")
            .args(flags)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start victoria-metrics");
        let vm = VictoriaMetrics {
            _child: KillOnDrop(child),
            port,
            _dir: dir,
        };
        wait_until("VictoriaMetrics to answer", Duration::from_secs(30), || {
            ureq::get(&format!("{}/health", vm.url())).call().is_ok()
        });
        vm
    }

    /// Where Prometheus and Grafana query it: its Prometheus-compatible API root.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Prometheus's `remote_write` section for it.
    pub fn remote_write(&self) -> String {
        format!("remote_write:\n  - url: {}/api/v1/write\n", self.url())
    }
}

/// Debian's PostgreSQL (`scripts/postgres-lab.sh`): the test database's URL, from
/// `CEEMS_TEST_POSTGRES_URL` (`scripts/test.sh` sets it) or from bringing it up (root).
pub fn postgres_tools() -> Result<String, String> {
    if let Ok(url) = std::env::var("CEEMS_TEST_POSTGRES_URL") {
        if !url.is_empty() {
            return Ok(url);
        }
    }
    if !nix::unistd::Uid::effective().is_root() {
        return Err("no CEEMS_TEST_POSTGRES_URL, and not root to set PostgreSQL up".into());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/postgres-lab.sh");
    let out = Command::new("bash")
        .arg(script)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "postgres-lab.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A new, empty schema in the test database, and the URL that makes it the one a server
/// uses (`search_path`).
pub fn postgres_schema(url: &str, name: &str) -> String {
    let schema = format!("{name}_{}", std::process::id());
    let out = Command::new("psql")
        .arg(url)
        .args(["-v", "ON_ERROR_STOP=1", "-q", "-c"])
        .arg(format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        ))
        .output()
        .expect("psql");
    assert!(
        out.status.success(),
        "psql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    format!("{url}?options[search_path]={schema}")
}
