//! The stats-server's data: units from a cluster's accounting (`crate::manager`) into SQLite or
//! PostgreSQL.

pub mod aggregate;
pub mod api;
pub mod api_yield;
pub mod db;
pub mod findings;
pub mod ingest;
pub mod nodes;
pub mod prometheus;
pub mod refresh;
pub mod report;
pub mod rules;
mod shared_read;
pub mod sql;
pub mod unit_cache;
pub mod waste;
