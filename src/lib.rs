//! ceems: compute energy and emissions monitoring for HPC batch jobs.
//!
//! One binary with subcommands (`exporter`, `stats-server`, `redfish-proxy`,
//! `check-privileges`, `mailprog`) sharing one config loader, one collector registry and one
//! web layer. The README's "Layout" says what each module holds and may import.

pub mod acct;
pub mod cmd;
pub mod collect;
pub mod config;
pub mod host;
pub mod lb;
pub mod log;
pub mod manager;
pub mod metrics;
pub mod notify;
pub mod policy;
pub mod proxy;
pub mod registry;
pub mod security;
pub mod store;
#[doc(hidden)]
pub mod testing;
pub mod tool;
pub mod web;
