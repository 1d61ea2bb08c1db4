//! Subcommands: flags and wiring only; the work lives in the library modules.

pub mod assets;
pub mod cacct;
pub mod check_privileges;
pub mod exporter;
pub mod k8s_admission_controller;
pub mod lb;
pub mod mail_opts;
pub mod mailprog;
pub mod redfish_proxy;
pub mod stats_server;
pub mod tool;

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use clap::Command;

/// The names CEEMS's own binaries had; a link with one of them runs that subcommand, so
/// existing systemd units keep working.
const ARGV0_ALIASES: &[(&str, &str)] = &[
    ("ceems_exporter", "exporter"),
    ("ceems_api_server", "stats-server"),
    ("redfish_proxy", "redfish-proxy"),
    ("ceems_lb", "lb"),
    ("ceems_tool", "tool"),
    ("cacct", "cacct"),
    ("ceems_k8s_admission_controller", "k8s-admission-controller"),
];

/// The git revision, branch and rustc version of this build (`build.rs`; "unknown" where the
/// source had no git).
pub const REVISION: &str = env!("CEEMS_REVISION");
pub const BRANCH: &str = env!("CEEMS_BRANCH");
pub const RUST_VERSION: &str = env!("CEEMS_RUSTC");

const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (revision ",
    env!("CEEMS_REVISION"),
    ")"
);
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (revision ",
    env!("CEEMS_REVISION"),
    ", branch ",
    env!("CEEMS_BRANCH"),
    ", rustc ",
    env!("CEEMS_RUSTC"),
    ")"
);

pub fn cli() -> Command {
    Command::new("ceems")
        .version(VERSION)
        .long_version(LONG_VERSION)
        .about("Compute energy and emissions monitoring for HPC batch jobs")
        .long_about(
            "Compute energy and emissions monitoring for HPC batch jobs.\n\n\
             One binary for the whole stack: run `ceems <subcommand> --help` for each part. \
             Invoked through a link named ceems_exporter, ceems_api_server, redfish_proxy, ceems_lb, \
             ceems_tool, cacct or ceems_k8s_admission_controller, \
             it runs that subcommand directly.",
        )
        .subcommand_required(true)
        .arg_required_else_help(true)
        .subcommand(exporter::command())
        .subcommand(stats_server::command())
        .subcommand(redfish_proxy::command())
        .subcommand(lb::command())
        .subcommand(check_privileges::command())
        .subcommand(mailprog::command())
        .subcommand(tool::command())
        .subcommand(cacct::command())
        .subcommand(k8s_admission_controller::command())
        .subcommand(assets::command())
}

fn dispatch(name: &str, matches: &clap::ArgMatches) -> anyhow::Result<ExitCode> {
    match name {
        "exporter" => exporter::run(matches),
        "stats-server" => stats_server::run(matches),
        "redfish-proxy" => redfish_proxy::run(matches),
        "lb" => lb::run(matches),
        "check-privileges" => check_privileges::run(matches),
        "mailprog" => mailprog::run(matches),
        "tool" => tool::run(matches),
        "cacct" => cacct::run(matches),
        "k8s-admission-controller" => k8s_admission_controller::run(matches),
        "generate-assets" => assets::run(matches),
        other => anyhow::bail!("unknown subcommand {other}"),
    }
}

/// Parses argv (by subcommand, or by argv[0] for the CEEMS binary names) and runs.
pub fn main(args: Vec<OsString>) -> ExitCode {
    let argv0 = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("ceems")
        .to_owned();
    // A setuid or setgid copy (cacct's install) runs cacct whatever its name: no other
    // subcommand may run with the ids its file grants.
    let alias = match crate::security::set_id() {
        true => Some(&("cacct", "cacct")),
        false => ARGV0_ALIASES.iter().find(|(alias, _)| *alias == argv0),
    };
    let result = match alias {
        Some((_, sub)) => {
            let cmd = cli().find_subcommand(sub).cloned().map(|c| {
                // CEEMS's programs answer --version; so do their names here.
                c.name(argv0.clone())
                    .bin_name(argv0.clone())
                    .version(VERSION)
                    .long_version(LONG_VERSION)
            });
            match cmd {
                Some(cmd) => {
                    let matches = cmd.get_matches_from(args);
                    dispatch(sub, &matches)
                }
                None => Err(anyhow::anyhow!("no subcommand {sub}")),
            }
        }
        None => {
            let matches = cli().get_matches_from(args);
            match matches.subcommand() {
                Some((name, sub)) => dispatch(name, sub),
                None => Ok(ExitCode::from(2)),
            }
        }
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            // The logger may not be up yet (bad config): print the whole chain to stderr.
            eprintln!("ceems: error: {}", error_chain(&err));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes, each said once: a cause whose words its parent's message already
/// holds (an OS error the parent names) is not repeated.
pub fn error_chain(err: &anyhow::Error) -> String {
    let mut text = err.to_string();
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_is_said_once() {
        let os = std::io::Error::from_raw_os_error(17);
        #[derive(Debug, thiserror::Error)]
        #[error("cannot create /srv/x: {source}")]
        struct Create {
            source: std::io::Error,
        }
        let err = anyhow::Error::new(Create { source: os }).context("starting");
        let text = error_chain(&err);
        assert_eq!(text.matches("File exists").count(), 1, "{text}");
        assert!(
            text.starts_with("starting: cannot create /srv/x: File exists"),
            "{text}"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_chain(&plain), "outer: inner");
    }
}
