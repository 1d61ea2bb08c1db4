//! Policies that act on running jobs that hold resources and use none: staged warnings by
//! mail, then a cancel through the job's manager, each exactly once.
//!
//! - `config`: a policy as a site writes it, with defaults and checks;
//! - `decide`: which stage is due and whether a job's use makes it idle (pure);
//! - `usage`: what the running jobs used, from Prometheus, in batches;
//! - `state`: the decisions in the store, claimed before they are acted on;
//! - `message`: the mail's words;
//! - `cycle`: one cycle over a cluster, called from the stats-server's loop.
//!
//! No manager is named here: a cancel goes through the cluster's `Accounting`.

pub mod config;
pub mod cycle;
pub mod decide;
pub mod message;
pub mod state;
pub mod usage;

pub use config::Policy;
pub use cycle::{Cycle, Engine, Mailer, PolicyError, Target};

#[cfg(test)]
mod tests;
