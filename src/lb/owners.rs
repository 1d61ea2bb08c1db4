//! Who may read which units and who is an admin: read from the stats-server's database (the
//! default, and the faster), or asked of its API as CEEMS's `ceems_lb` does when its config
//! names `ceems_api_server.web.url` (`/api/v1/units/verify` as the user, the admins from
//! `/api/v1/users/admin?role=admin` as CEEMS's service account).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::backend::StoreAccess;
use crate::store::db::{Readers, Store, StoreError, Tenure, SERVICE_ACCOUNT};

/// Why who owns what could not be told.
#[derive(Debug, thiserror::Error)]
pub enum OwnersError {
    #[error("the stats-server's database: {0}")]
    Database(#[from] StoreError),
    #[error("the stats-server's API ({url}): {reason}")]
    Unreachable { url: String, reason: String },
    #[error("the stats-server's API answered {status} to {what}: {body}")]
    Answer {
        status: u16,
        what: &'static str,
        body: String,
    },
    #[error("the stats-server's admins' list: {0}")]
    Admins(String),
    #[error("the stats-server's clusters' list: {0}")]
    Clusters(String),
}

/// What the stats-server says of the units a request names.
#[derive(Debug, Default)]
pub struct Readable {
    /// Those the user may read.
    pub units: BTreeSet<String>,
    /// Every unit holding one of the ids, when the database says (not the API).
    pub tenures: Option<Vec<Tenure>>,
}

impl Readable {
    /// Each readable unit with the units that held its id, when known.
    pub fn by_unit(&self) -> impl Iterator<Item = (&String, Option<Vec<Tenure>>)> {
        self.units.iter().map(|u| {
            let tenures = self
                .tenures
                .as_ref()
                .map(|all| all.iter().filter(|t| &t.uuid == u).cloned().collect());
            (u, tenures)
        })
    }
}

/// Where ownership is looked up.
pub enum Owners {
    /// The database, and who besides admins reads a unit.
    Database(Arc<Store>, Readers),
    Api(ApiOwners),
}

/// The stats-server's API, as the load balancer's client of it.
pub struct ApiOwners {
    /// `http(s)://host:port`, no trailing slash.
    base: String,
    /// The header the server reads the user from.
    user_header: String,
    agent: ureq::Agent,
    /// Credentials and headers sent with every request (a server behind basic auth).
    added: Vec<(String, String)>,
}

impl ApiOwners {
    /// A client of the API at `base` with `access`'s TLS, credentials and headers.
    pub fn new(
        base: &str,
        user_header: &str,
        timeout: Duration,
        access: &StoreAccess,
    ) -> Result<ApiOwners, OwnersError> {
        let agent = crate::web::client::agent_with_tls(
            crate::web::client::Timeouts::all(timeout),
            &access.tls,
        )
        .map_err(|reason| OwnersError::Unreachable {
            url: base.to_owned(),
            reason,
        })?;
        let added = access
            .request_headers()
            .into_iter()
            .map(|(name, value, _)| (name, value))
            .collect();
        Ok(ApiOwners {
            base: base.trim_end_matches('/').to_owned(),
            user_header: user_header.to_owned(),
            agent,
            added,
        })
    }

    /// GET `path_and_query` as `user`: the status and body, or why there is none.
    async fn get(&self, path_and_query: String, user: &str) -> Result<(u16, String), OwnersError> {
        let url = format!("{}{path_and_query}", self.base);
        let (agent, header, user, added) = (
            self.agent.clone(),
            self.user_header.clone(),
            user.to_owned(),
            self.added.clone(),
        );
        let asked = url.clone();
        let unreachable = |reason: String| OwnersError::Unreachable {
            url: asked.clone(),
            reason,
        };
        tokio::task::spawn_blocking(move || {
            let mut request = agent.get(&url);
            for (k, v) in &added {
                request = request.set(k, v);
            }
            match request.set(&header, &user).call() {
                Ok(r) => Ok((r.status(), r.into_string().unwrap_or_default())),
                Err(ureq::Error::Status(code, r)) => {
                    Ok((code, r.into_string().unwrap_or_default()))
                }
                Err(e) => Err(e.to_string()),
            }
        })
        .await
        .map_err(|e| unreachable(e.to_string()))?
        .map_err(unreachable)
    }
}

impl Owners {
    /// Of `uuids` on `cluster`, those `user` may read, and, from the database, every unit
    /// that held each of them (ids wrap) with its times. The API answers for all of them at
    /// once, without times: all when it says yes, none when it refuses.
    pub async fn readable(
        &self,
        cluster: &str,
        user: &str,
        uuids: &[String],
    ) -> Result<Readable, OwnersError> {
        match self {
            Owners::Database(store, readers) => {
                let tenures = store.unit_tenures(cluster, user, uuids, *readers).await?;
                Ok(Readable {
                    units: tenures
                        .iter()
                        .filter(|t| t.theirs)
                        .map(|t| t.uuid.clone())
                        .collect(),
                    tenures: Some(tenures),
                })
            }
            Owners::Api(api) => {
                let path = {
                    let mut query = form_urlencoded::Serializer::new(String::new());
                    query.append_pair("cluster_id", cluster);
                    for u in uuids {
                        query.append_pair("uuid", u);
                    }
                    format!("/api/v1/units/verify?{}", query.finish())
                };
                let units = match api.get(path, user).await? {
                    (200, _) => uuids.iter().cloned().collect(),
                    (401 | 403, _) => BTreeSet::new(),
                    (status, body) => {
                        return Err(OwnersError::Answer {
                            status,
                            what: "the ownership check",
                            body: body.chars().take(200).collect(),
                        })
                    }
                };
                Ok(Readable {
                    units,
                    tenures: None,
                })
            }
        }
    }

    /// The clusters the stats-server has units of, to tell the operator at start about a
    /// cluster served here that it does not know (its users would be refused every job).
    pub async fn cluster_ids(&self) -> Result<BTreeSet<String>, OwnersError> {
        match self {
            Owners::Database(store, _) => Ok(store.unit_cluster_ids().await?.into_iter().collect()),
            Owners::Api(api) => {
                let path = "/api/v1/clusters/admin".to_owned();
                match api.get(path, SERVICE_ACCOUNT).await? {
                    (200, body) => cluster_ids(&body).map_err(OwnersError::Clusters),
                    (status, body) => Err(OwnersError::Answer {
                        status,
                        what: "the clusters' list",
                        body: body.chars().take(200).collect(),
                    }),
                }
            }
        }
    }

    /// Whether `user` is one of the stats-server's admins.
    pub async fn is_admin(&self, user: &str) -> Result<bool, OwnersError> {
        match self {
            Owners::Database(store, _) => Ok(store.is_admin(user).await?),
            Owners::Api(api) => {
                let path = "/api/v1/users/admin?role=admin".to_owned();
                match api.get(path, SERVICE_ACCOUNT).await? {
                    (200, body) => Ok(admin_names(&body)
                        .map_err(OwnersError::Admins)?
                        .contains(user)),
                    (status, body) => Err(OwnersError::Answer {
                        status,
                        what: "the admins' list",
                        body: body.chars().take(200).collect(),
                    }),
                }
            }
        }
    }
}

/// The ids of `/api/v1/clusters/admin`'s answer.
fn cluster_ids(body: &str) -> Result<BTreeSet<String>, String> {
    let answer: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("not JSON: {e}"))?;
    let list = answer["data"].as_array().ok_or("no data list")?;
    Ok(list
        .iter()
        .filter_map(|c| c["id"].as_str().map(str::to_owned))
        .collect())
}

/// The names in an answer of `/users/admin?role=admin`.
fn admin_names(body: &str) -> Result<BTreeSet<String>, String> {
    let v: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("the admins' list is not JSON: {e}"))?;
    let list = v["data"]
        .as_array()
        .ok_or("the admins' list has no data list")?;
    Ok(list
        .iter()
        .filter_map(|u| u["name"].as_str().map(str::to_owned))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_names_are_read_and_a_malformed_list_is_an_error() {
        let names = admin_names(
            r#"{"status":"success","data":[{"cluster_id":"all","name":"grafana","tags":["config"]},{"name":"ceems-int-svc"}]}"#,
        )
        .unwrap();
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            ["ceems-int-svc", "grafana"]
        );
        assert!(admin_names("<html>").unwrap_err().contains("not JSON"));
        assert!(admin_names(r#"{"status":"success"}"#)
            .unwrap_err()
            .contains("no data list"));
    }
}
