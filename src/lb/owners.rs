//! Who may read which units and who is an admin: read from the stats-server's database (the
//! default, and the faster), or asked of its API as CEEMS's `ceems_lb` does when its config
//! names `ceems_api_server.web.url` (`/api/v1/units/verify` as the user, the admins from
//! `/api/v1/users/admin?role=admin` as CEEMS's service account).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::store::db::{Store, SERVICE_ACCOUNT};

/// Where ownership is looked up.
pub enum Owners {
    Database(Arc<Store>),
    Api(ApiOwners),
}

/// The stats-server's API, as the load balancer's client of it.
pub struct ApiOwners {
    /// `http(s)://host:port`, no trailing slash.
    base: String,
    /// The header the server reads the user from.
    user_header: String,
    agent: ureq::Agent,
}

impl ApiOwners {
    pub fn new(base: &str, user_header: &str, timeout: Duration) -> ApiOwners {
        ApiOwners {
            base: base.trim_end_matches('/').to_owned(),
            user_header: user_header.to_owned(),
            agent: ureq::AgentBuilder::new().timeout(timeout).build(),
        }
    }

    /// GET `path_and_query` as `user`: the status and body, or why there is none.
    async fn get(&self, path_and_query: String, user: &str) -> Result<(u16, String), String> {
        let url = format!("{}{path_and_query}", self.base);
        let (agent, header, user) = (
            self.agent.clone(),
            self.user_header.clone(),
            user.to_owned(),
        );
        let asked = url.clone();
        tokio::task::spawn_blocking(move || match agent.get(&url).set(&header, &user).call() {
            Ok(r) => Ok((r.status(), r.into_string().unwrap_or_default())),
            Err(ureq::Error::Status(code, r)) => Ok((code, r.into_string().unwrap_or_default())),
            Err(e) => Err(e.to_string()),
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("the stats-server's API ({asked}): {e}"))
    }
}

impl Owners {
    /// Of `uuids` on `cluster`, those `user` may read. The API answers for all of them at once:
    /// all when it says yes, none when it refuses.
    pub async fn readable(
        &self,
        cluster: &str,
        user: &str,
        uuids: &[String],
    ) -> Result<BTreeSet<String>, String> {
        match self {
            Owners::Database(store) => store
                .units_readable_by(cluster, user, uuids)
                .await
                .map_err(|e| e.to_string()),
            Owners::Api(api) => {
                let path = {
                    let mut query = form_urlencoded::Serializer::new(String::new());
                    query.append_pair("cluster_id", cluster);
                    for u in uuids {
                        query.append_pair("uuid", u);
                    }
                    format!("/api/v1/units/verify?{}", query.finish())
                };
                match api.get(path, user).await? {
                    (200, _) => Ok(uuids.iter().cloned().collect()),
                    (401 | 403, _) => Ok(BTreeSet::new()),
                    (status, body) => Err(format!(
                        "the stats-server's API answered {status} to the ownership check: {}",
                        body.chars().take(200).collect::<String>()
                    )),
                }
            }
        }
    }

    /// Whether `user` is one of the stats-server's admins.
    pub async fn is_admin(&self, user: &str) -> Result<bool, String> {
        match self {
            Owners::Database(store) => store.is_admin(user).await.map_err(|e| e.to_string()),
            Owners::Api(api) => {
                let path = "/api/v1/users/admin?role=admin".to_owned();
                match api.get(path, SERVICE_ACCOUNT).await? {
                    (200, body) => Ok(admin_names(&body)?.contains(user)),
                    (status, body) => Err(format!(
                        "the stats-server's API answered {status} to the admins' list: {}",
                        body.chars().take(200).collect::<String>()
                    )),
                }
            }
        }
    }
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
