//! `ceems check-privileges`: Say which Linux capabilities each enabled collector needs, which ones the process or binary has, and what to change.

use std::process::ExitCode;

use clap::{ArgMatches, Command};

use crate::config;

pub fn command() -> Command {
    config::build_command(
        Command::new("check-privileges").about("Say which Linux capabilities each enabled collector needs, which ones the process or binary has, and what to change"),
        &config::log_opts(),
    )
}

pub fn run(_matches: &ArgMatches) -> anyhow::Result<ExitCode> {
    super::not_implemented("check-privileges")
}
