//! `ceems check-privileges <subcommand> [its flags]`: says which capabilities each enabled part
//! of that subcommand needs, what this process and binary have, what a real privileged
//! operation gives when done as the daemon does it, and the lines that fix what is missing.
//! Exit 0: all present; 1: something is missing; 2: bad usage.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use caps::Capability;
use clap::{Arg, ArgMatches, Command};

use super::{exporter, lb, redfish_proxy, stats_server};
use crate::collect::Paths;
use crate::config::{self, Layered};
use crate::registry;
use crate::security::check::{self, OperationTest, PartCheck, ProcessReport, Report, TestOutcome};
use crate::security::{self, SecuritySettings};

pub fn command() -> Command {
    Command::new("check-privileges")
        .about("Say which Linux capabilities each enabled collector needs, which ones the process or binary has, and what to change")
        .long_about(
            "Say which Linux capabilities each enabled part of a subcommand needs, which ones \
             this process and the binary have, whether a real privileged operation works when \
             done the way the daemon does it, and the setcap, systemd or sudoers lines that fix \
             what is missing. Give it the subcommand and the same flags and config file as \
             the daemon, and run it as the daemon is started (same user, same capabilities).\n\n\
             Exit status: 0 when everything needed is present, 1 when something is missing, \
             2 on bad usage.",
        )
        .arg(
            Arg::new("output")
                .long("output")
                .value_parser(["text", "json"])
                .default_value("text")
                .global(true)
                .help("Report format: text for people, json for automation"),
        )
        .subcommand_required(true)
        .subcommand(exporter::command())
        .subcommand(redfish_proxy::command())
        .subcommand(stats_server::command())
        .subcommand(lb::command())
}

/// The listeners of a daemon (the lb has two when it relays Pyroscope too): binding below 1024
/// needs CAP_NET_BIND_SERVICE unless root. The daemon binds before it drops privileges, and
/// so does this test.
fn listener_parts(settings: &Layered, sub: &str) -> anyhow::Result<Vec<PartCheck>> {
    let addresses: Vec<String> = match settings.get::<toml::Value>("web.listen-address")? {
        toml::Value::Array(list) => list
            .iter()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect(),
        other => vec![other.as_str().unwrap_or_default().to_owned()],
    };
    let several = addresses.len() > 1;
    addresses
        .into_iter()
        .map(|listen| {
            let mut part = listener_part(&listen, sub)?;
            if several {
                part.part = format!("listener {listen}");
            }
            Ok(part)
        })
        .collect()
}

/// CEEMS's program name of a subcommand, as a link to `ceems` is named.
fn link_name(sub: &str) -> &'static str {
    match sub {
        "exporter" => "ceems_exporter",
        "stats-server" => "ceems_api_server",
        "lb" => "ceems_lb",
        _ => "redfish_proxy",
    }
}

fn listener_part(listen: &str, sub: &str) -> anyhow::Result<PartCheck> {
    let port: u16 = listen
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let needs = if port != 0 && port < 1024 {
        vec![Capability::CAP_NET_BIND_SERVICE]
    } else {
        Vec::new()
    };
    let test = match crate::web::bind_std(listen) {
        Ok(_) => OperationTest {
            operation: format!("listen on {listen}"),
            outcome: TestOutcome::Ok,
            error: None,
        },
        Err(crate::web::WebError::Bind { source, .. }) => {
            let mut t = OperationTest {
                operation: format!("listen on {listen}"),
                outcome: TestOutcome::Error,
                error: Some(source.to_string()),
            };
            if source.kind() == std::io::ErrorKind::PermissionDenied {
                t.outcome = TestOutcome::Denied;
            }
            // On a node where the daemon already runs, its own port is in use by it.
            if source.kind() == std::io::ErrorKind::AddrInUse {
                let holders = crate::host::listeners::holders(Path::new("/proc"), port);
                match holders.iter().find(|h| h.is_ceems(sub, link_name(sub))) {
                    Some(running) => {
                        t.outcome = TestOutcome::Ok;
                        t.operation = format!(
                            "listen on {listen} (held by the running ceems {sub}, {})",
                            running.describe()
                        );
                        t.error = None;
                    }
                    None if !holders.is_empty() => {
                        let who: Vec<String> = holders.iter().map(|h| h.describe()).collect();
                        t.error = Some(format!("{source}: held by {}", who.join(", ")));
                    }
                    None => {}
                }
            }
            t
        }
        Err(e) => return Err(e.into()),
    };
    Ok(PartCheck {
        part: "listener".into(),
        needs,
        missing: Vec::new(),
        test: Some(test),
    })
}

pub fn run(matches: &ArgMatches) -> anyhow::Result<ExitCode> {
    let json = matches.get_one::<String>("output").map(String::as_str) == Some("json");
    let Some((sub, sub_matches)) = matches.subcommand() else {
        return Ok(ExitCode::from(2));
    };
    let opts = match sub {
        "exporter" => exporter::opts(),
        "redfish-proxy" => redfish_proxy::opts(),
        "stats-server" => stats_server::opts(),
        "lb" => lb::opts(),
        _ => return Ok(ExitCode::from(2)),
    };
    let settings = config::load(sub, &opts, sub_matches)?;

    // What this process and binary have, before anything is dropped.
    let process = ProcessReport::new(&security::process_caps().context("reading capabilities")?);
    let binary = std::env::current_exe().context("locating this binary")?;
    let file_caps = security::file_caps(&binary).unwrap_or(None);

    let mut parts = listener_parts(&settings, sub)?;
    let listeners = parts.len();
    let mut collectors = Vec::new();
    let mut sudo_commands = Vec::new();
    let mut subs = Vec::new();
    if sub == "exporter" {
        let selection = registry::select(&settings)?;
        subs = registry::sub_collectors(&selection);
        for (spec, layer) in &selection.enabled {
            collectors.push(*spec);
            if spec.name == crate::collect::ipmi::SPEC.name {
                if let Ok(Some(cmd)) = layer.get::<Option<String>>("cmd") {
                    if let Some(program) = cmd.split_whitespace().next() {
                        sudo_commands.push(program.to_owned());
                    }
                }
            }
        }
    }
    // The stats-server's Slurm commands, run as the slurm user; none with slurmrestd.
    let mut run_as: Option<(PathBuf, String, Vec<Capability>)> = None;
    if sub == "stats-server" && settings.get::<String>("slurm.source")? != "slurmrestd" {
        let caps = stats_server::needed_capabilities(&settings)?;
        let user: String = settings.get("slurm.run-as-user")?;
        let sacct: PathBuf = settings.get("slurm.sacct.path")?;
        let sacct = crate::host::command::find_program(
            &sacct.display().to_string(),
            std::env::var_os("PATH").as_deref(),
        )
        .unwrap_or(sacct);
        sudo_commands.push(sacct.display().to_string());
        if !user.is_empty() {
            run_as = Some((sacct, user, caps));
        }
    }
    let needed = security::sorted(
        parts
            .iter()
            .flat_map(|p| p.needs.clone())
            .chain(
                collectors
                    .iter()
                    .flat_map(|s| s.capabilities.iter().copied()),
            )
            .chain(run_as.iter().flat_map(|(_, _, c)| c.iter().copied()))
            .chain(subs.iter().flat_map(|(_, caps)| caps.iter().copied())),
    );

    // Then test as the daemon runs: privileges dropped the same way.
    let sec: SecuritySettings = settings.get("security")?;
    let outcome = security::drop_privileges(&sec, &needed).context("dropping privileges")?;
    let held = security::process_caps()
        .context("reading capabilities")?
        .permitted;
    let missing_of = |needs: &[Capability]| -> Vec<Capability> {
        needs
            .iter()
            .filter(|c| !held.contains(c))
            .copied()
            .collect()
    };
    for listener in parts.iter_mut().take(listeners) {
        // The daemon binds before it drops: what counts is what it started with.
        listener.missing = listener
            .needs
            .iter()
            .filter(|c| !process.permitted.contains(c))
            .copied()
            .collect();
    }
    let paths: Option<Paths> = (sub == "exporter")
        .then(|| settings.get("path"))
        .transpose()?;
    for spec in &collectors {
        let caps = spec.capabilities;
        let test = paths
            .as_ref()
            .zip(spec.self_test)
            .map(|(p, self_test)| self_test(p, caps));
        parts.push(PartCheck {
            part: format!("collector {}", spec.name),
            needs: caps.to_vec(),
            missing: missing_of(caps),
            test,
        });
    }
    // The k8s collector's GPUs come through the kubelet's socket: a file mode, not a capability.
    if paths.is_some()
        && collectors
            .iter()
            .any(|s| s.name == crate::manager::k8s::MANAGER)
    {
        let socket: PathBuf = settings.get("collector.k8s.kubelet-podresources-socket.file")?;
        parts.push(PartCheck {
            part: "k8s pod-resources socket".into(),
            needs: Vec::new(),
            missing: Vec::new(),
            test: Some(check::test_unix_socket(&socket)),
        });
    }
    for (part, caps) in &subs {
        let test = paths
            .as_ref()
            .filter(|_| part.starts_with("perf"))
            .map(|p| check::test_perf_open(&p.procfs, caps));
        parts.push(PartCheck {
            part: (*part).to_owned(),
            needs: caps.to_vec(),
            missing: missing_of(caps),
            test,
        });
    }
    if let Some((sacct, user, caps)) = &run_as {
        parts.push(PartCheck {
            part: format!("slurm commands as {user}"),
            needs: caps.clone(),
            missing: missing_of(caps),
            test: Some(check::test_run_as(sacct, user, caps)),
        });
    }
    // An OpenPBS complex's log is under root's server_priv: a file mode, not a capability.
    if sub == "stats-server" {
        for dir in openpbs_accounting_dirs(&settings)? {
            parts.push(PartCheck {
                part: "openpbs accounting log".into(),
                needs: Vec::new(),
                missing: Vec::new(),
                test: Some(check::test_pbs_accounting(&dir)),
            });
        }
    }
    // An OpenStack cloud's Keystone credentials are in the config file: not for every user.
    if sub == "stats-server" {
        let clouds = stats_server::cluster_entries(&settings)?
            .iter()
            .any(|(_, manager, _)| manager == crate::manager::openstack::MANAGER);
        if let (true, Some(file)) = (clouds, settings.file.as_ref()) {
            parts.push(PartCheck {
                part: "openstack credentials".into(),
                needs: Vec::new(),
                missing: Vec::new(),
                test: Some(check::test_secret_file(file, "Keystone's credentials")),
            });
        }
    }
    // The stats-server writes its SQLite directory as the user it runs as.
    if sub == "stats-server"
        && settings
            .get::<String>("storage.database-url")?
            .trim()
            .is_empty()
    {
        let dir: PathBuf = settings.get("storage.data.path")?;
        let created_at_start = sec.drop_privileges && process.euid == 0;
        parts.push(PartCheck {
            part: "the database's directory".into(),
            needs: Vec::new(),
            missing: Vec::new(),
            test: Some(stats_server::test_data_dir(&dir, created_at_start)),
        });
    }
    // The lb reads the stats-server's SQLite file: no capability, but the file's mode.
    if sub == "lb"
        && settings
            .get::<String>("storage.database-url")?
            .trim()
            .is_empty()
    {
        let dir: PathBuf = settings.get("storage.data.path")?;
        parts.push(PartCheck {
            part: "the stats-server's database".into(),
            needs: Vec::new(),
            missing: Vec::new(),
            test: Some(lb::test_database_readable(&dir.join("ceems.db"))),
        });
    }
    tracing::debug!(?outcome, "privileges for the checks");
    let report = Report::new(sub, process, binary, file_caps, parts, &sudo_commands);
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.text());
    }
    Ok(if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The accounting log directories of the configured OpenPBS complexes: a file mode under
/// root's server_priv, not a capability.
fn openpbs_accounting_dirs(settings: &Layered) -> anyhow::Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    for (id, manager, keys) in stats_server::cluster_entries(settings)? {
        if manager != crate::manager::openpbs::MANAGER {
            continue;
        }
        let entry = crate::manager::registry::ClusterEntry {
            id: &id,
            keys,
            settings,
        };
        dirs.extend(crate::manager::openpbs::setup::accounting_dir(&entry)?);
    }
    Ok(dirs)
}
