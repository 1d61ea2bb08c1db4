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
    println!(
        "man pages in {}, completions in {}",
        man.display(),
        completions.display()
    );
    Ok(ExitCode::SUCCESS)
}
