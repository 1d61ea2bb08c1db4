//! `ceems stats-server`: Pull jobs from Slurm into SQLite, compute per-job energy and emissions, and serve a JSON API for Grafana (:9020).

use std::process::ExitCode;

use clap::{ArgMatches, Command};

use crate::config;

pub fn command() -> Command {
    config::build_command(
        Command::new("stats-server").about("Pull jobs from Slurm into SQLite, compute per-job energy and emissions, and serve a JSON API for Grafana (:9020)"),
        &config::log_opts(),
    )
}

pub fn run(_matches: &ArgMatches) -> anyhow::Result<ExitCode> {
    super::not_implemented("stats-server")
}
