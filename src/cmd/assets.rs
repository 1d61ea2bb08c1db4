//! `ceems generate-assets DIR` (hidden): man pages and shell completions generated from the
//! command line definitions, for the packages to install.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Arg, ArgMatches, Command};

pub fn command() -> Command {
    Command::new("generate-assets")
        .hide(true)
        .about("Write man pages (man/) and shell completions (completions/) into a directory")
        .arg(
            Arg::new("dir")
                .required(true)
                .value_parser(clap::value_parser!(PathBuf)),
        )
}

fn write_man(cmd: &Command, name: &str, dir: &Path) -> anyhow::Result<()> {
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd.clone().name(name.to_owned()))
        .render(&mut buf)
        .with_context(|| format!("rendering the man page of {name}"))?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, buf).with_context(|| format!("writing {}", path.display()))
}

/// docs/reference/configuration.md: every option of the daemons, as a flag, a key of their
/// table in the TOML file and an environment variable, with its default and help, from the
/// same definitions the command line and the loader use (tests/docs.rs keeps it current).
pub fn configuration_reference() -> String {
    use crate::config::{env_name, Kind};
    let mut out = String::from(
        "# Configuration reference\n\n\
Generated from the programs' option definitions by `ceems generate-assets DIR` \
(`DIR/configuration.md`); `tests/docs.rs` fails when this file is stale. Each option is a \
flag, a key of the subcommand's table in the TOML file of `--config.file` (see \
`examples/ceems.toml`) and an environment variable. Precedence, lowest first: the default, \
the file, the environment, the flag. CEEMS's YAML files are read too (see \
[compat.md](../compat.md)).\n",
    );
    let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    for (sub, names, opts) in [
        ("exporter", "`ceems_exporter`", super::exporter::opts()),
        (
            "stats-server",
            "`ceems_api_server`",
            super::stats_server::opts(),
        ),
        ("lb", "`ceems_lb`", super::lb::opts()),
        (
            "redfish-proxy",
            "`redfish_proxy`",
            super::redfish_proxy::opts(),
        ),
        ("mailprog", "Slurm's `MailProg`", super::mailprog::opts()),
        (
            "k8s-admission-controller",
            "`ceems_k8s_admission_controller`",
            super::k8s_admission_controller::opts(),
        ),
    ] {
        out.push_str(&format!(
            "\n## `ceems {sub}` ({names})\n\n| Flag | Key in `[{sub}]` | Environment | Default | What |\n| --- | --- | --- | --- | --- |\n"
        ));
        for o in opts.iter().filter(|o| !o.hidden) {
            let (flag, env) = match o.kind {
                Kind::FileOnly => ("—".to_owned(), "—".to_owned()),
                _ => (
                    format!("`--{}`", o.flag),
                    format!(
                        "`{}`",
                        o.env.clone().unwrap_or_else(|| env_name(sub, &o.flag))
                    ),
                ),
            };
            let default = match (&o.default, o.kind) {
                (Some(d), _) if d.is_empty() => "`\"\"`".to_owned(),
                (Some(d), _) => format!("`{}`", cell(d)),
                (None, Kind::Flag) => "`false`".to_owned(),
                (None, _) => String::new(),
            };
            out.push_str(&format!(
                "| {flag} | `{}` | {env} | {default} | {} |\n",
                o.key,
                cell(&o.help)
            ));
        }
    }
    out
}

pub fn run(matches: &ArgMatches) -> anyhow::Result<ExitCode> {
    let Some(dir) = matches.get_one::<PathBuf>("dir") else {
        return Ok(ExitCode::from(2));
    };
    let man = dir.join("man");
    let completions = dir.join("completions");
    for d in [&man, &completions] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let mut cli = super::cli();
    cli.build();
    write_man(&cli, "ceems", &man)?;
    for sub in cli
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        write_man(sub, &format!("ceems-{}", sub.get_name()), &man)?;
    }
    for shell in [
        clap_complete::Shell::Bash,
        clap_complete::Shell::Zsh,
        clap_complete::Shell::Fish,
    ] {
        clap_complete::generate_to(shell, &mut super::cli(), "ceems", &completions)
            .with_context(|| format!("writing {shell} completions"))?;
    }
    let reference = dir.join("configuration.md");
    std::fs::write(&reference, configuration_reference())
        .with_context(|| format!("writing {}", reference.display()))?;
    println!(
        "man pages in {}, completions in {}",
        man.display(),
        completions.display()
    );
    Ok(ExitCode::SUCCESS)
}
