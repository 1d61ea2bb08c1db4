//! Every `ceems_exporter …` and `redfish_proxy …` command line of CEEMS's exporter documentation
//! (listed in tests/fixtures/ceems-doc-commands.txt), run as written through the binary's CEEMS
//! names, with CEEMS's fixture trees, stand-in files for the paths it names and a free port
//! added: each starts and serves what it enables, or fails at start saying what is missing.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::bmc::StandinBmc;
use common::{fixtures, free_port, KillOnDrop, Running};

/// A documented command: its line in the document and its words.
struct DocCommand {
    line: usize,
    program: String,
    args: Vec<String>,
}

fn documented() -> Vec<DocCommand> {
    let text = std::fs::read_to_string(fixtures().join("ceems-doc-commands.txt")).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (line, command) = l.split_once('\t').expect("<line>\\t<command>");
            // The document's only quoting is `--flag="value"`.
            let mut words = command.split_whitespace().map(|w| w.replace('"', ""));
            DocCommand {
                line: line.parse().expect("line number"),
                program: words.next().expect("program"),
                args: words.collect(),
            }
        })
        .collect()
}

/// What a command must do here.
enum Expect {
    /// Serves `/metrics` with these series name prefixes (and a success gauge per collector).
    Metrics(&'static [&'static str]),
    /// Serves the Alloy targets.
    AlloyTargets,
    /// The proxy relays an exporter's Redfish requests.
    Proxy,
    /// Stops at start, saying this.
    Refused(&'static str),
}

fn expectation(line: usize) -> Expect {
    match line {
        // perf and eBPF: the unit collector serves, whatever jobs run here (a kernel that
        // refuses the eBPF programs turns only them off).
        183 | 196 => Expect::Metrics(&["ceems_scrape_collector_success{collector=\"slurm\"} 1"]),
        245 => Expect::Metrics(&["ceems_scrape_collector_success{collector=\"libvirt\"} 1"]),
        238 => Expect::Metrics(&[
            "ceems_scrape_collector_success{collector=\"libvirt\"} 1",
            "ceems_compute_unit_cpu_user_seconds_total{cgrouphostname=\"\",hostname=",
        ]),
        // No OpenIPMI device here: the collector runs and says so at each scrape. The v0.10
        // document's flag is an alias of today's `ipmi` collector, which reports by that name.
        289 => Expect::Metrics(&["ceems_scrape_collector_success{collector=\"ipmi\"} 0"]),
        // The document's next sentence: the web config "must be provided".
        311 => Expect::Refused("needs --collector.redfish.config.file"),
        411 => Expect::Metrics(&[
            "ceems_scrape_collector_success{collector=\"redfish\"} 1",
            // Today's name: the document's command line does not ask for v0.10 names.
            "ceems_redfish_power_current_watts{chassis=\"1U\"",
        ]),
        472 => Expect::Proxy,
        548 | 570 => Expect::AlloyTargets,
        560 => Expect::AlloyTargets,
        other => panic!("line {other} of the document has no expectation here: add one"),
    }
}

/// The exporter's Redfish config: straight to `bmc`, or through `proxy` as the document's
/// proxy deployment does.
fn redfish_config(dir: &Path, bmc: &StandinBmc, proxy: Option<&str>) -> PathBuf {
    let path = dir.join(format!("redfish-{}.yml", proxy.is_some()));
    let external = proxy
        .map(|p| format!("  external_url: {p}\n"))
        .unwrap_or_default();
    std::fs::write(
        &path,
        format!(
            "redfish_web_config:\n  protocol: http\n  hostname: 127.0.0.1\n  port: {}\n{external}  username: admin\n  password: secret\n  insecure_skip_verify: true\n  use_session_token: true\n",
            bmc.port
        ),
    )
    .unwrap();
    path
}

/// `args` with the document's paths replaced by files of `dir` and the listen address by `port`.
fn localised(args: &[String], dir: &Path, bmc: &StandinBmc, port: u16) -> Vec<String> {
    let mut out: Vec<String> = args
        .iter()
        .filter(|a| !a.starts_with("--web.listen-address"))
        .map(|a| match a.split_once('=') {
            Some(("--collector.redfish.web-config", _)) => format!(
                "--collector.redfish.web-config={}",
                redfish_config(dir, bmc, None).display()
            ),
            Some(("--config.file", _)) => {
                // The document's file, and the one line that says where BMCs may be.
                let path = dir.join("config.yml");
                std::fs::write(
                    &path,
                    "---\nredfish_config:\n  web:\n    insecure_skip_verify: false\n  bmc_networks: [127.0.0.0/8]\n",
                )
                .unwrap();
                format!("--config.file={}", path.display())
            }
            _ => a.clone(),
        })
        .collect();
    out.push(format!("--web.listen-address=127.0.0.1:{port}"));
    out
}

fn spawn(program: &Path, args: &[String], cwd: &Path) -> Result<Running, String> {
    let port: u16 = args
        .iter()
        .find_map(|a| a.strip_prefix("--web.listen-address=127.0.0.1:"))
        .and_then(|p| p.parse().ok())
        .expect("a port");
    let mut child = KillOnDrop(
        Command::new(program)
            .args(args)
            .current_dir(cwd)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    loop {
        if let Ok(Some(_)) = child.0.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.0.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return Err(err);
        }
        // Started when it answers HTTP: a port that is bound but not served yet (the exporter
        // binds, drops privileges, then builds its collectors) accepts a TCP connection even
        // when the program is about to refuse its flags.
        let answered = matches!(
            ureq::get(&format!("http://127.0.0.1:{port}/"))
                .timeout(Duration::from_millis(500))
                .call(),
            Ok(_) | Err(ureq::Error::Status(..))
        );
        if answered {
            // Keep reading its log so that it never blocks on a full pipe.
            if let Some(mut e) = child.0.stderr.take() {
                std::thread::spawn(move || std::io::copy(&mut e, &mut std::io::sink()));
            }
            return Ok(Running { child, port });
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no answer in 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn every_documented_command_line_works_as_written() {
    let compat = fixtures().join("compat");
    let bin = tempfile::tempdir().unwrap();
    for name in ["ceems_exporter", "redfish_proxy"] {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ceems"), bin.path().join(name)).unwrap();
    }
    let files = tempfile::tempdir().unwrap();
    let bmc = StandinBmc::with_sessions(320.0, false);
    let commands = documented();
    assert!(commands.len() >= 11, "the list lost lines");
    for cmd in commands {
        let port = free_port();
        let mut args = localised(&cmd.args, files.path(), &bmc, port);
        if cmd.program == "ceems_exporter" {
            args.extend(
                [
                    "--path.sysfs=sys",
                    "--path.cgroupfs=sys/fs/cgroup",
                    "--path.procfs=proc",
                    "--collector.libvirt.xml-dir=fixtures/qemu",
                ]
                .map(String::from),
            );
        }
        let what = format!("line {}: {} {}", cmd.line, cmd.program, args.join(" "));
        let started = spawn(&bin.path().join(&cmd.program), &args, &compat);
        match (expectation(cmd.line), started) {
            (Expect::Refused(why), Err(err)) => assert!(err.contains(why), "{what}: {err}"),
            (Expect::Refused(why), Ok(_)) => panic!("{what}: started, expected `{why}`"),
            (_, Err(err)) => panic!("{what}: did not start: {err}"),
            (Expect::Metrics(wanted), Ok(running)) => {
                let text = running.get("/metrics");
                for w in wanted {
                    assert!(text.contains(w), "{what}: no `{w}` in\n{text}");
                }
            }
            (Expect::AlloyTargets, Ok(running)) => {
                let body = running.get("/alloy-targets");
                let targets: serde_json::Value = serde_json::from_str(&body).unwrap();
                assert!(targets.is_array(), "{what}: {body}");
                if cmd.args.iter().any(|a| a == "--collector.slurm") {
                    assert!(running
                        .get("/metrics")
                        .contains("ceems_scrape_collector_success{collector=\"slurm\"} 1"));
                }
            }
            (Expect::Proxy, Ok(proxy)) => {
                // The document's exporter config for the proxy, with the stand-in BMC.
                let config = redfish_config(files.path(), &bmc, Some(&proxy.url("")));
                let exporter = common::start_exporter(
                    &compat,
                    &[
                        "--collector.disable-defaults",
                        "--collector.redfish",
                        &format!("--collector.redfish.web-config={}", config.display()),
                    ],
                );
                let text = exporter.get("/metrics");
                assert!(
                    text.contains("ceems_scrape_collector_success{collector=\"redfish\"} 1"),
                    "{what}: {text}"
                );
            }
        }
    }
}

/// Where the document is at hand (not in a fresh clone), the list above is still its lines.
#[test]
fn the_list_is_the_documents() {
    let Some(doc) = std::fs::read_dir(fixtures().join("../../../shared/seeds"))
        .ok()
        .and_then(|d| {
            d.flatten()
                .map(|e| e.path())
                .find(|p| p.to_string_lossy().contains("004_"))
        })
    else {
        println!("skipped: the seed documents are not next to this checkout");
        return;
    };
    let text = std::fs::read_to_string(doc).unwrap();
    let mut in_comment = false;
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        in_comment |= line.contains("<!--");
        let l = line.trim();
        if !in_comment && (l.starts_with("ceems_exporter ") || l.starts_with("redfish_proxy ")) {
            found.push(format!("{}\t{l}", i + 1));
        }
        if line.contains("-->") {
            in_comment = false;
        }
    }
    let listed: Vec<String> = std::fs::read_to_string(fixtures().join("ceems-doc-commands.txt"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(str::to_owned)
        .collect();
    assert_eq!(listed, found);
}
