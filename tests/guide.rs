//! docs/guide/slurm.md, run block by block as its last section says, on the real Slurm lab
//! with Debian's Prometheus: the files it writes, the commands it runs (systemctl starting what
//! the packaged units start), then what a site looks at: the job in the exporter, in the API
//! for its owner only, through the lb for its owner only, in cacct and in its report.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::lab::{lab, prometheus_tools, wait_until, CancelOnDrop};
use common::{free_port, runnable};

/// One fenced block of the guide: its language, its `key=value` (or bare) attributes, its text.
struct Block {
    lang: String,
    attrs: BTreeMap<String, String>,
    text: String,
}

fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for line in markdown.lines() {
        match (line.strip_prefix("```"), open.take()) {
            (Some(_), Some(block)) => out.push(block),
            (Some(info), None) => {
                let mut words = info.split_whitespace();
                let lang = words.next().unwrap_or("").to_owned();
                let attrs = words
                    .map(|w| match w.split_once('=') {
                        Some((k, v)) => (k.to_owned(), v.to_owned()),
                        None => (w.to_owned(), String::new()),
                    })
                    .collect();
                open = Some(Block {
                    lang,
                    attrs,
                    text: String::new(),
                });
            }
            (None, Some(mut block)) => {
                block.text.push_str(line);
                block.text.push('\n');
                open = Some(block);
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "an unclosed block");
    out
}

/// The scratch root the guide's paths and ports are moved to.
struct Site {
    root: tempfile::TempDir,
    ports: [(u16, u16); 4],
    units: Vec<PathBuf>,
}

impl Site {
    fn new() -> Site {
        let root = tempfile::tempdir().unwrap();
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let ports = [9010, 9020, 9030, 9090].map(|p| (p, free_port()));
        Site {
            root,
            ports,
            units: Vec::new(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel.trim_start_matches('/'))
    }

    fn port(&self, guide: u16) -> u16 {
        self.ports.iter().find(|(g, _)| *g == guide).unwrap().1
    }

    /// The guide's text with its paths and ports moved.
    fn map(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for dir in [
            "/etc/ceems",
            "/etc/prometheus",
            "/etc/grafana",
            "/usr/share/doc/ceems",
            "/var/lib/ceems",
        ] {
            text = text.replace(dir, &self.path(dir).display().to_string());
        }
        for (guide, here) in self.ports {
            text = text.replace(&format!(":{guide}"), &format!(":{here}"));
        }
        text
    }

    /// What the package installs that the guide reads: the binary under CEEMS's names, the
    /// examples, the state directory; and `systemctl`, which starts a unit's `ExecStart`.
    fn install(&mut self) {
        let bin = self.path("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for name in [
            "ceems",
            "ceems_exporter",
            "ceems_api_server",
            "ceems_lb",
            "cacct",
        ] {
            std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ceems"), bin.join(name)).unwrap();
        }
        let rules = self.path("/usr/share/doc/ceems/examples/prometheus");
        std::fs::create_dir_all(&rules).unwrap();
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        for entry in std::fs::read_dir(repo.join("examples/prometheus/rules")).unwrap() {
            let p = entry.unwrap().path();
            if p.to_string_lossy().ends_with(".rules.yml") {
                std::fs::copy(&p, rules.join(p.file_name().unwrap())).unwrap();
            }
        }
        for dir in ["/etc/ceems", "/var/lib/ceems", "units"] {
            std::fs::create_dir_all(self.path(dir)).unwrap();
        }
        // The stats-server drops to nobody, as the unit's ceems user owns its state directory.
        std::fs::set_permissions(
            self.path("/var/lib/ceems"),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        // cacct reads the scratch config.yml as a user's own (see the guide's last section).
        std::fs::create_dir_all(self.path("xdg")).unwrap();
        std::os::unix::fs::symlink(self.path("/etc/ceems"), self.path("xdg/ceems")).unwrap();
        let data = format!(
            "--storage.data.path={}",
            self.path("/var/lib/ceems").display()
        );
        for (unit, port, moved) in [
            ("ceems_exporter", 9010, ""),
            ("ceems_api_server", 9020, data.as_str()),
            ("ceems_lb", 9030, data.as_str()),
        ] {
            let text =
                std::fs::read_to_string(repo.join(format!("packaging/systemd/{unit}.service")))
                    .unwrap();
            let exec = text
                .lines()
                .find_map(|l| l.strip_prefix("ExecStart="))
                .unwrap()
                .replace("/usr/bin/", &format!("{}/", bin.display()));
            let exec = format!(
                "{} --web.listen-address=127.0.0.1:{} {moved}",
                self.map(&exec),
                self.port(port)
            );
            self.unit(unit, &exec, self.port(port));
        }
        // Debian's unit runs /usr/bin/prometheus with /etc/prometheus/prometheus.yml.
        let exec = format!(
            "prometheus --config.file={} --storage.tsdb.path={} --web.listen-address=127.0.0.1:{}",
            self.path("/etc/prometheus/prometheus.yml").display(),
            self.path("prometheus-data").display(),
            self.port(9090)
        );
        self.unit("prometheus", &exec, self.port(9090));
        let systemctl = format!(
            r#"#!/bin/bash
# The test's systemctl: enable --now UNIT and restart UNIT start the unit's command.
unit="${{@: -1}}"; unit="${{unit%.service}}"; dir={units}
[ -f "$dir/$unit.cmd" ] || {{ echo "no unit $unit"; exit 1; }}
if [ -f "$dir/$unit.pid" ]; then kill "$(cat "$dir/$unit.pid")" 2>/dev/null; sleep 1; fi
setsid bash "$dir/$unit.cmd" >"$dir/$unit.log" 2>&1 </dev/null &
echo $! >"$dir/$unit.pid"
for _ in $(seq 150); do
  curl -s -o /dev/null "http://127.0.0.1:$(cat "$dir/$unit.port")/" && exit 0
  sleep 0.2
done
echo "$unit did not start:"; cat "$dir/$unit.log"; exit 1
"#,
            units = self.path("units").display()
        );
        std::fs::write(bin.join("systemctl"), systemctl).unwrap();
        std::fs::set_permissions(
            bin.join("systemctl"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
    }

    fn unit(&mut self, name: &str, exec: &str, port: u16) {
        let dir = self.path("units");
        std::fs::write(dir.join(format!("{name}.cmd")), format!("exec {exec}\n")).unwrap();
        std::fs::write(dir.join(format!("{name}.port")), port.to_string()).unwrap();
        self.units.push(dir.join(format!("{name}.pid")));
    }

    /// Runs a `sh` block (mapped) as `user`; its output, or a panic saying what failed.
    fn run(&self, block: &Block) -> String {
        let script = format!("set -eo pipefail\n{}", self.map(&block.text));
        let path = format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            self.path("bin").display()
        );
        let user = block.attrs.get("as").map(String::as_str).unwrap_or("root");
        let home = match user {
            "root" => "/root".to_owned(),
            u => format!("/home/{u}"),
        };
        let out = Command::new("runuser")
            .args(["-u", user, "--", "env"])
            .arg(format!("PATH={path}"))
            .arg(format!("HOME={home}"))
            .arg(format!("USER={user}"))
            .arg(format!("XDG_CONFIG_HOME={}", self.path("xdg").display()))
            .args(["bash", "-c", &script])
            .current_dir("/tmp")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "the guide's block failed:\n{}\nit said:\n{said}\n{}",
            block.text,
            self.logs()
        );
        said
    }

    fn logs(&self) -> String {
        self.units
            .iter()
            .map(|pid| {
                let log = pid.with_extension("log");
                format!(
                    "--- {}:\n{}",
                    log.display(),
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            })
            .collect()
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        for pid in &self.units {
            if let Ok(pid) = std::fs::read_to_string(pid) {
                let _ = Command::new("kill").arg(pid.trim()).status();
            }
        }
    }
}

fn get(url: &str, user: &str) -> (u16, String) {
    match ureq::get(url).set("X-Grafana-User", user).call() {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(s, r)) => (s, r.into_string().unwrap()),
        Err(e) => panic!("{url}: {e}"),
    }
}

#[test]
fn the_slurm_guide_runs_as_written_and_a_job_is_seen_everywhere() {
    if !runnable("guide", lab().and_then(|_| prometheus_tools())) {
        return;
    }
    // cacct would read a real /etc/ceems/config.yml before the scratch one.
    assert!(
        !Path::new("/etc/ceems/config.yml").exists(),
        "/etc/ceems/config.yml exists: a ceems package is installed here"
    );
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let guide = std::fs::read_to_string(repo.join("docs/guide/slurm.md")).unwrap();
    let mut site = Site::new();
    site.install();
    let mut outputs = Vec::new();
    for block in blocks(&guide) {
        if block.attrs.contains_key("package") {
            // scripts/package-test.sh installs what scripts/package.sh builds, with dpkg -i.
            let deb = format!("ceems_{}-1_amd64.deb", env!("CARGO_PKG_VERSION"));
            assert_eq!(block.text.trim(), format!("dpkg -i {deb}"));
            let test = std::fs::read_to_string(repo.join("scripts/package-test.sh")).unwrap();
            assert!(test.contains("dpkg -i \"$deb\""));
            continue;
        }
        if let Some(file) = block.attrs.get("file") {
            let path = site.path(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let text = site.map(&block.text);
            let text = match block.attrs.contains_key("append") {
                true => std::fs::read_to_string(&path).unwrap() + "\n" + &text,
                false => text,
            };
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            continue;
        }
        assert_eq!(
            block.lang, "sh",
            "a block the test cannot run: {}",
            block.text
        );
        outputs.push(site.run(&block));
    }
    let job = std::fs::read_to_string("/home/alice/ceems-check.id")
        .unwrap()
        .trim()
        .to_owned();
    let _cancel = CancelOnDrop(vec![job.clone()]);
    println!("{}", outputs.join("\n---\n"));

    // The exporter block printed the job's series; cacct's, its row.
    assert!(
        outputs
            .iter()
            .any(|o| o.contains(&format!("uuid=\"{job}\""))),
        "the exporter did not show job {job}:\n{outputs:#?}"
    );
    // The packaged config is the guide's first fragment.
    let packaged: toml::Table =
        toml::from_str(&std::fs::read_to_string(repo.join("packaging/ceems.toml")).unwrap())
            .unwrap();
    let first = blocks(&guide)
        .into_iter()
        .find(|b| {
            b.attrs
                .get("file")
                .is_some_and(|f| f == "/etc/ceems/ceems.toml")
        })
        .unwrap();
    let first: toml::Table = toml::from_str(&first.text).unwrap();
    assert_eq!(packaged["exporter"], first["exporter"]);

    // The API: alice's job for alice, not for bob.
    let api = format!("http://127.0.0.1:{}", site.port(9020));
    let units = format!("{api}/api/v1/units?uuid={job}&field=uuid&field=username");
    let (_, mine) = get(&units, "alice");
    assert!(mine.contains(&format!("\"uuid\":\"{job}\"")), "{mine}");
    let (_, theirs) = get(&units, "bob");
    assert!(!theirs.contains(&job), "bob sees alice's job: {theirs}");
    // The lb, as Grafana's datasource of the guide calls it: alice's series, bob refused.
    let datasources: serde_norway::Value = serde_norway::from_str(
        &std::fs::read_to_string(site.path("/etc/grafana/provisioning/datasources/ceems.yml"))
            .unwrap(),
    )
    .unwrap();
    let lb = datasources["datasources"][0]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    let q = format!(
        "{lb}/api/v1/query?query=ceems_compute_unit_cpu_user_seconds_total%7Buuid%3D%22{job}%22%7D"
    );
    let mut answer = String::new();
    wait_until(
        "alice's series through the lb",
        Duration::from_secs(60),
        || {
            answer = get(&q, "alice").1;
            answer.contains(&format!("\"uuid\":\"{job}\""))
        },
    );
    assert_eq!(get(&q, "bob").0, 403);
    let api_ds = datasources["datasources"][1]["url"].as_str().unwrap();
    assert_eq!(api_ds, api.replace("127.0.0.1", "localhost"));
    // cacct printed the job; the report is the job's, with its figures or what is missing.
    assert!(
        outputs.iter().any(|o| o
            .lines()
            .any(|l| l.contains(&format!("│ {job} ")) && l.contains("│ alice "))),
        "cacct did not list job {job}:\n{outputs:#?}"
    );
    let report = outputs.last().unwrap();
    assert!(
        report.contains(&format!("Job {job} \"ceems-check\" on lab")),
        "{report}"
    );
    assert!(report.contains("State      COMPLETED"), "{report}");
    assert!(
        report.contains("kWh") || report.contains("no power data"),
        "{report}"
    );
}
