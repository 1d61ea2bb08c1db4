//! The stats-server's data: jobs from Slurm's accounting (`sacct`) into SQLite.

pub mod aggregate;
pub mod api;
pub mod db;
pub mod findings;
pub mod ingest;
pub mod prometheus;
pub mod report;
pub mod runner;
pub mod sacct;
pub mod unit_cache;
