//! Who may read what, shared by the Prometheus and the Pyroscope frontends: the user a request
//! names, whether they are an admin, and whether the units a request reads are theirs, with
//! the recent answers of the stats-server kept a minute.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Instant;

use hyper::header::HeaderName;
use hyper::StatusCode;

use super::owners::{Owners, Readable};
use super::window::Window;
use super::{Refusal, UNIT_FORBIDDEN};
use crate::store::db::Tenure;

/// CEEMS's answer to a request that names no user.
pub const NO_USER_HEADER: &str = "no user header found. Make sure to set send_user_header = true in [dataproxy] section of Grafana configuration file.";

/// Longest user name accepted, as the stats-server's.
const MAX_USER_BYTES: usize = 256;

/// How long the database's answers are trusted: a job never changes owner, and the admins
/// change when the stats-server restarts; a user who leaves a project keeps its jobs this long.
const VERDICT_TTL: std::time::Duration = std::time::Duration::from_secs(60);
/// Verdicts kept at most; beyond, they are forgotten at once.
const MAX_VERDICTS: usize = 100_000;

/// The database's recent answers: whether a user is an admin, and the units a user may read
/// (only the yeses: a job the stats-server has not ingested yet may be theirs in a minute),
/// each with every unit that held its id, when the database says. Dashboards ask for the same
/// jobs again and again; each answer saves a query.
#[derive(Default)]
struct Verdicts {
    admins: Mutex<HashMap<String, (bool, Instant)>>,
    readable: Mutex<HashMap<UserUnit, Verdict>>,
}

/// (cluster, user, unit id).
type UserUnit = (String, String, String);

/// When a unit was found readable, and the units that held its id, when known.
type Verdict = (Instant, Option<Vec<Tenure>>);

impl Verdicts {
    fn admin(&self, user: &str) -> Option<bool> {
        let admins = self.admins.lock().unwrap_or_else(|p| p.into_inner());
        admins
            .get(user)
            .filter(|(_, at)| at.elapsed() < VERDICT_TTL)
            .map(|(yes, _)| *yes)
    }

    fn set_admin(&self, user: &str, yes: bool) {
        let mut admins = self.admins.lock().unwrap_or_else(|p| p.into_inner());
        if admins.len() >= MAX_VERDICTS {
            admins.clear();
        }
        admins.insert(user.to_owned(), (yes, Instant::now()));
    }

    /// The units of `wanted` known to be readable by `user` on `cluster`, with their ids'
    /// units when known.
    fn readable(
        &self,
        cluster: &str,
        user: &str,
        wanted: &BTreeSet<String>,
    ) -> HashMap<String, Option<Vec<Tenure>>> {
        let readable = self.readable.lock().unwrap_or_else(|p| p.into_inner());
        wanted
            .iter()
            .filter_map(|u| {
                readable
                    .get(&(cluster.to_owned(), user.to_owned(), u.clone()))
                    .filter(|(at, _)| at.elapsed() < VERDICT_TTL)
                    .map(|(_, tenures)| (u.clone(), tenures.clone()))
            })
            .collect()
    }

    fn set_readable(&self, cluster: &str, user: &str, found: &Readable) {
        let mut readable = self.readable.lock().unwrap_or_else(|p| p.into_inner());
        if readable.len() + found.units.len() > MAX_VERDICTS {
            readable.clear();
        }
        let now = Instant::now();
        for (u, tenures) in found.by_unit() {
            readable.insert(
                (cluster.to_owned(), user.to_owned(), u.clone()),
                (now, tenures),
            );
        }
    }
}

/// The user header, the admins and where ownership is read.
pub struct Access {
    owners: Owners,
    user_header: HeaderName,
    admins: BTreeSet<String>,
    verdicts: Verdicts,
    /// Seconds a unit's window is widened by on each side (one scrape interval).
    margin: f64,
}

impl Access {
    pub fn new(
        owners: Owners,
        user_header: HeaderName,
        admins: BTreeSet<String>,
        margin: std::time::Duration,
    ) -> Access {
        Access {
            owners,
            user_header,
            admins,
            verdicts: Verdicts::default(),
            margin: margin.as_secs_f64(),
        }
    }

    /// Warns about each of `served` the stats-server has no unit of: its users would be
    /// refused every job (a cluster named differently here and there).
    pub async fn warn_unknown_clusters(&self, served: &[String]) {
        match self.owners.cluster_ids().await {
            Ok(known) => {
                for id in served.iter().filter(|id| !known.contains(*id)) {
                    let known: Vec<&String> = known.iter().collect();
                    tracing::warn!(
                        cluster = %id,
                        ?known,
                        "the stats-server has no job of this cluster: its users will be refused their jobs until it has; name it as the stats-server does (its --slurm.cluster-id, slurm.conf's ClusterName, or a clusters entry's id)"
                    );
                }
            }
            Err(e) => {
                tracing::info!(error = %e, "cannot tell which clusters the stats-server knows")
            }
        }
    }

    /// The user the configured header names.
    pub fn user(&self, headers: &hyper::HeaderMap) -> Result<String, Refusal> {
        match headers
            .get(&self.user_header)
            .map(|v| v.to_str().map(str::trim))
        {
            Some(Ok(u)) if u.len() > MAX_USER_BYTES => Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "the {} header is longer than {MAX_USER_BYTES} bytes",
                    self.user_header
                ),
            )),
            Some(Ok(u)) if !u.is_empty() => Ok(u.to_owned()),
            _ => Err(Refusal::new(
                StatusCode::UNAUTHORIZED,
                // CEEMS's words, which say what to fix in Grafana.
                NO_USER_HEADER,
            )),
        }
    }

    pub async fn is_admin(&self, user: &str) -> bool {
        if self.admins.contains(user) {
            return true;
        }
        if let Some(yes) = self.verdicts.admin(user) {
            return yes;
        }
        match self.owners.is_admin(user).await {
            Ok(yes) => {
                self.verdicts.set_admin(user, yes);
                yes
            }
            Err(e) => {
                tracing::warn!(%user, error = %e, "cannot read the admins; not one");
                false
            }
        }
    }

    /// Refuses unless every one of `units` on `cluster` is `user`'s to read; the window of
    /// time they were theirs, when the database says.
    pub async fn check_units(
        &self,
        cluster: &str,
        user: &str,
        units: &BTreeSet<String>,
    ) -> Result<Option<Window>, Refusal> {
        let mut readable = self.verdicts.readable(cluster, user, units);
        let unknown: Vec<String> = units
            .iter()
            .filter(|u| !readable.contains_key(*u))
            .cloned()
            .collect();
        // Units the database holds no record of at all (not someone else's: not there yet).
        let mut never_seen: BTreeSet<String> = BTreeSet::new();
        if !unknown.is_empty() {
            let found = self
                .owners
                .readable(cluster, user, &unknown)
                .await
                .map_err(|e| {
                    Refusal::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("ownership check: {e}"),
                    )
                })?;
            if let Some(all) = &found.tenures {
                never_seen.extend(
                    unknown
                        .iter()
                        .filter(|u| !all.iter().any(|t| &t.uuid == *u))
                        .cloned(),
                );
            }
            self.verdicts.set_readable(cluster, user, &found);
            readable.extend(found.by_unit().map(|(u, tenures)| (u.clone(), tenures)));
        }
        if let Some(new) = units
            .iter()
            .find(|u| !readable.contains_key(*u) && never_seen.contains(*u))
        {
            tracing::info!(%user, unit = %new, %cluster, "query refused: the stats-server does not know the unit yet");
            return Err(Refusal::forbidden(format!(
                "job {new} is not known to the stats-server yet: it is pulled at the next update (--storage.update-interval), or at once when the stats-server's API or report is asked for it"
            )));
        }
        if let Some(other) = units.iter().find(|u| !readable.contains_key(*u)) {
            // CEEMS's words, which its users know; which unit, in the log.
            tracing::info!(%user, unit = %other, %cluster, "query refused: not the user's unit");
            return Err(Refusal::forbidden(UNIT_FORBIDDEN));
        }
        let mut tenures = Vec::new();
        for known in readable.into_values() {
            match known {
                Some(t) => tenures.extend(t),
                // The API tells no times.
                None => return Ok(None),
            }
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        Ok(Window::of(&tenures, self.margin, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_keep_yeses_per_user_and_cluster() {
        let v = Verdicts::default();
        let units: BTreeSet<String> = ["1".to_owned(), "2".to_owned()].into();
        let found = Readable {
            units: ["1".to_owned()].into(),
            tenures: None,
        };
        v.set_readable("lab", "alice", &found);
        assert_eq!(
            v.readable("lab", "alice", &units)
                .into_keys()
                .collect::<Vec<_>>(),
            ["1"]
        );
        assert!(v.readable("lab", "bob", &units).is_empty());
        assert!(v.readable("other", "alice", &units).is_empty());
        assert_eq!(v.admin("root"), None);
        v.set_admin("root", true);
        v.set_admin("alice", false);
        assert_eq!(
            (v.admin("root"), v.admin("alice")),
            (Some(true), Some(false))
        );
    }
}
