//! The stats-server's data: jobs from Slurm's accounting (`sacct`) into SQLite.

pub mod db;
pub mod ingest;
pub mod sacct;
