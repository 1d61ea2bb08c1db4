//! The stats-server's JSON API under `/api/v1`, in CEEMS's envelope:
//! `{"status":"success","data":[…]}` or `{"status":"error","errorType":…,"error":…}`.
//!
//! The user is the value of a header that Grafana sets (`X-Grafana-User`). A user sees only
//! their own jobs and usage; the `/admin` routes are for the configured admins. Every value
//! from a request reaches SQL as a bound parameter; column names come from a fixed list.
//!
//! Routing and the answer cache are here; each family of routes (`units`, `usage`,
//! `accounts`, `findings`) is a module, over the envelope (`answer`), the request's parameters
//! (`params`), the `/units` field model (`fields`) and SQL with bound values (`sql`).

use std::collections::BTreeMap;

use hyper::StatusCode;
use serde_json::{json, Map, Value};

use super::db::{measured, Store};
use super::sql::{Backend, DbRow, Sql, OPEN_END};
use super::unit_cache::{self, JobSpan, Rendered, UnitCache, UserSpans};

mod accounts;
mod answer;
mod ceems_routes;
mod fields;
mod findings;
mod in_flight;
mod params;
mod pull;
mod render;
mod rerun;
mod units;
mod usage;
mod waste;

use answer::*;
pub use answer::{Answer, ApiError};
pub use fields::UNIT_FIELDS;
use fields::*;
pub use params::Params;
use params::*;
use render::*;

/// Default window of `/units` and `/usage/current` when `from` is not given.
pub const DEFAULT_WINDOW_SECONDS: i64 = 24 * 3600;
/// Most rows one `/units` answer holds.
pub const MAX_UNITS: i64 = 100_000;

/// Most answers kept; past it, or past the answers' bytes, the cache starts over.
const CACHE_ENTRIES: usize = 4096;
/// Bytes the API keeps between requests, all its caches together, unless told otherwise.
pub const DEFAULT_CACHE_BYTES: usize = 32 << 20;

/// Answers by request, valid while the store's generation is unchanged: Grafana asks the same
/// questions at every refresh of every viewer's dashboard, and data changes only when the
/// update loop writes.
#[derive(Default)]
struct Cache {
    generation: u64,
    bytes: usize,
    answers: std::collections::HashMap<String, Answer>,
}

/// The longest user name the user header may carry: it becomes part of cache keys and log
/// lines, and no directory gives longer names (the Linux login limit is 32 bytes).
pub const MAX_USER_BYTES: usize = 256;

/// Time zones a request named (`timezone=`) and jobs were rendered in: a rendered job's cache
/// key holds the index (1-based; 0 is the server's zone). Past this many, jobs in a zone not
/// in the list are rendered for the one request.
const MAX_ZONES: usize = (1 << (64 - fields::FIELD_BITS)) - 2;

/// The API over a store.
pub struct Api {
    store: std::sync::Arc<Store>,
    pub user_header: String,
    cache: std::sync::Mutex<Cache>,
    /// Requests being answered, which identical ones wait for.
    in_flight: in_flight::InFlight<Answer>,
    units: UnitCache,
    /// Most bytes of `cache`.
    cache_bytes: usize,
    /// Where times are written when a request names no `timezone`.
    time_zone: jiff::tz::TimeZone,
    zones: std::sync::Mutex<Vec<String>>,
    /// The sub-key of the emissions series (`owid_total`): the provider our recording rules
    /// take the factor from.
    emissions_key: String,
    /// Units named by id and not held yet are pulled from their manager first.
    on_demand: Option<pull::OnDemand>,
}

impl Api {
    /// The user a request names in the user header, trimmed; 401 when it names none, 400 when
    /// the name is longer than any site gives.
    pub fn user<'a>(&self, header: Option<&'a str>) -> Result<&'a str, ApiError> {
        match header.map(str::trim) {
            Some(u) if u.len() > MAX_USER_BYTES => Err(ApiError::BadData(format!(
                "the {} header is {} bytes long; a user name is at most {MAX_USER_BYTES}",
                self.user_header,
                u.len()
            ))),
            Some(u) if !u.is_empty() => Ok(u),
            _ => Err(ApiError::Unauthorized(format!(
                "no user: the request has no {} header",
                self.user_header
            ))),
        }
    }

    /// Refuses `user` unless an admin, as CEEMS words it.
    pub(super) async fn require_admin(&self, user: &str) -> Result<(), ApiError> {
        match self.store.is_admin(user).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(ApiError::Forbidden(
                "current user does not have admin privileges".to_owned(),
            )),
            Err(e) => Err(ApiError::Internal(e.to_string())),
        }
    }

    pub fn new(store: std::sync::Arc<Store>, user_header: &str) -> Api {
        Api {
            store,
            user_header: user_header.to_owned(),
            cache: Default::default(),
            in_flight: Default::default(),
            units: Default::default(),
            cache_bytes: 0,
            time_zone: jiff::tz::TimeZone::system(),
            zones: Default::default(),
            emissions_key: "owid_total".to_owned(),
            on_demand: None,
        }
        .with_cache_bytes(DEFAULT_CACHE_BYTES)
    }

    /// Keeps at most `bytes` between requests: a quarter for answers by request, the rest
    /// for `/units` (users' jobs, rendered jobs, answers). 0 keeps nothing.
    pub fn with_cache_bytes(mut self, bytes: usize) -> Api {
        self.units = UnitCache::with_budget(bytes - bytes / 4);
        self.cache_bytes = bytes / 4;
        self
    }

    /// Times are written in `zone` unless a request names one.
    pub fn with_time_zone(mut self, zone: jiff::tz::TimeZone) -> Api {
        self.time_zone = zone;
        self
    }

    /// Emissions are `<provider>_total` in the series objects.
    pub fn with_emissions_provider(mut self, provider: &str) -> Api {
        self.emissions_key = format!("{provider}_total");
        self
    }

    /// The zone a request names (`timezone=Europe/Athens`) and the byte of a rendered job's
    /// cache key that names it; `None` for the byte when the zone list is full.
    fn zone(&self, p: &Params) -> Result<(jiff::tz::TimeZone, Option<u64>), ApiError> {
        let Some(name) = p.one("timezone").filter(|n| !n.is_empty()) else {
            return Ok((self.time_zone.clone(), Some(0)));
        };
        let zone =
            jiff::tz::TimeZone::get(name).map_err(|e| ApiError::bad(format!("`timezone`: {e}")))?;
        let Ok(mut zones) = self.zones.lock() else {
            return Ok((zone, None));
        };
        let index = match zones.iter().position(|z| z == name) {
            Some(i) => Some(i),
            None if zones.len() < MAX_ZONES => {
                zones.push(name.to_owned());
                Some(zones.len() - 1)
            }
            None => None,
        };
        Ok((zone, index.map(|i| i as u64 + 1)))
    }

    fn cached(&self, key: &str, generation: u64) -> Option<Answer> {
        let cache = self.cache.lock().ok()?;
        if cache.generation != generation {
            return None;
        }
        cache.answers.get(key).cloned()
    }

    fn remember(&self, key: String, generation: u64, answer: &Answer) {
        let Ok(mut cache) = self.cache.lock() else {
            return;
        };
        // A request that read before a write must not evict answers made after it.
        if generation < cache.generation {
            return;
        }
        let size = key.len() + answer.body.len();
        if cache.generation != generation
            || cache.answers.len() >= CACHE_ENTRIES
            || cache.bytes + size > self.cache_bytes
        {
            *cache = Cache {
                generation,
                ..Default::default()
            };
        }
        if size <= self.cache_bytes {
            cache.bytes += size;
            cache.answers.insert(key, answer.clone());
        }
    }

    /// Answers `GET path?query` for `user` (the header's value, if any) at time `now`.
    pub async fn handle(
        &self,
        path: &str,
        query: Option<&str>,
        user: Option<&str>,
        now: i64,
    ) -> Answer {
        let Some(route) = path.strip_prefix("/api/v1") else {
            return ApiError::NotFound(format!("no route {path}")).into();
        };
        let route = route.trim_end_matches('/');
        if route == "/health" {
            return match self.store.integrity_ping().await {
                Ok(()) => Answer::data(json!("ok")),
                Err(e) => ApiError::Unavailable(e.to_string()).into(),
            };
        }
        // CEEMS's samples of its shapes need no user.
        if let Some(resource) = route.strip_prefix("/demo/") {
            return self.demo(resource).unwrap_or_else(Answer::from);
        }
        let user = match self.user(user) {
            Ok(u) => u,
            Err(e) => return e.into(),
        };
        let (route, admin_route) = match route.strip_suffix("/admin") {
            Some(r) => (r, true),
            None => (route, false),
        };
        // A job started since the last update, named by id (Grafana's job dashboards), is
        // pulled first: read after, the generation covers it.
        if matches!(route, "/units" | "/units/verify") {
            self.pull_unknown(&Params::parse(query), user, now).await;
        }
        // The default window ends at the next full minute, so that answers can be shared
        // for a minute.
        let now = now.div_euclid(60) * 60 + 60;
        // An admin route's answer is cached only for a user who was an admin at that
        // generation; the admin list is written through the store, which bumps it.
        let key = format!(
            "{user}\0{admin_route}\0{route}\0{}\0{now}",
            query.unwrap_or("")
        );
        // Read before anything else: what is then read is at least as new.
        let generation = match self.store.generation().await {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(error = %e, "the database does not answer");
                return ApiError::Unavailable(format!("the database does not answer: {e}")).into();
            }
        };
        if let Some(hit) = self.cached(&key, generation) {
            return hit;
        }
        self.units.catch_up(generation, |from| {
            self.store.units_changed(from, generation)
        });
        if admin_route {
            if let Err(e) = self.require_admin(user).await {
                return e.into();
            }
        }
        let leader = match self.in_flight.join(&key, generation) {
            in_flight::Turn::Wait(answer) => match answer.await {
                Ok(answer) => return answer,
                // Its maker gave up: make it here.
                Err(_) => None,
            },
            in_flight::Turn::Lead(leader) => Some(leader),
            in_flight::Turn::Alone => None,
        };
        let p = Params::parse(query);
        let scope = if admin_route { None } else { Some(user) };
        let result = match route {
            "/units" => self.units(&p, scope, now, generation).await,
            "/usage/current" => self.usage_current(&p, scope, now).await,
            "/usage/global" => self.usage_global(&p, scope).await,
            "/projects" => self.projects(&p, scope).await,
            "/users" => self.users(&p, scope).await,
            "/clusters" if admin_route => self.clusters(&p).await,
            "/units/verify" if !admin_route => self.verify(&p, user).await,
            "/stats/current" if admin_route => match window(&p, now) {
                Ok(w) => self.stats(&p, Some(w)).await,
                Err(e) => Err(e),
            },
            "/stats/global" if admin_route => self.stats(&p, None).await,
            "/findings" if admin_route => self.findings_summary(&p, now).await,
            "/waste" if admin_route => self.waste(&p, now).await,
            r if r.starts_with("/units/") && r.ends_with("/findings") && !admin_route => {
                let ids = &r["/units/".len()..r.len() - "/findings".len()];
                match ids.split_once('/') {
                    Some((cluster, job)) => self.job_findings(cluster, job, user).await,
                    None => Err(ApiError::bad("expected /units/{cluster}/{jobid}/findings")),
                }
            }
            _ => Err(ApiError::NotFound(format!("no route {path}"))),
        };
        let answer = result.unwrap_or_else(Answer::from);
        if let Some(leader) = leader {
            leader.finish(&answer);
        }
        if answer.status == StatusCode::OK {
            self.remember(key, generation, &answer);
        }
        answer
    }

    async fn fetch(&self, sql: Sql) -> Result<Vec<DbRow>, ApiError> {
        self.store.fetch_all(&sql).await.map_err(query_failed)
    }
}

#[cfg(test)]
mod dashboard_tests;
#[cfg(test)]
pub(crate) mod tests;
