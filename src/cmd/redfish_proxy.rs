//! `ceems redfish-proxy`: Relay exporters' Redfish requests to BMCs (:5000).

use std::process::ExitCode;

use clap::{ArgMatches, Command};

use crate::config;

pub fn command() -> Command {
    config::build_command(
        Command::new("redfish-proxy").about("Relay exporters' Redfish requests to BMCs (:5000)"),
        &config::log_opts(),
    )
}

pub fn run(_matches: &ArgMatches) -> anyhow::Result<ExitCode> {
    super::not_implemented("redfish-proxy")
}
