//! How much memory the stats-server's caches may hold: a management node runs it beside
//! Prometheus, slurmdbd and the lb, and what it keeps must not grow with the database.

use super::*;

pub(super) fn opts() -> Vec<Opt> {
    vec![
        Opt::new(
            "web.cache-size",
            Kind::Str,
            "Most memory the API keeps between requests (users' jobs, rendered jobs, whole answers; a size such as 32MiB); past it the cache starts over; 0 keeps nothing",
        )
        .default("32MiB"),
        Opt::new(
            "storage.sqlite.cache-size",
            Kind::Str,
            "Most memory SQLite's page caches hold, all connections together (a size such as 32MiB): half the writer's, whose sorts may take as much again before they spill to disk, half the readers'; the kernel caches the file as well. Not used with PostgreSQL",
        )
        .default("32MiB"),
    ]
}

/// The caches' budgets, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Budgets {
    pub(super) api_cache: usize,
    pub(super) sqlite_page_cache: u64,
}

impl Budgets {
    pub(super) fn of(settings: &Layered) -> anyhow::Result<Budgets> {
        #[derive(Deserialize)]
        struct Size(#[serde(deserialize_with = "config::de_bytes")] u64);
        let api_cache = settings.get::<Size>("web.cache-size")?.0;
        Ok(Budgets {
            api_cache: usize::try_from(api_cache)
                .with_context(|| format!("--web.cache-size {api_cache} is too large"))?,
            sqlite_page_cache: settings.get::<Size>("storage.sqlite.cache-size")?.0,
        })
    }
}
