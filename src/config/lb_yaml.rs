//! CEEMS's `ceems_lb` configuration file (YAML), read as the `lb` table of the shared loader,
//! so that `--config.file=/etc/ceems_lb/config.yml` works as CEEMS documents it. The file may
//! be the one CEEMS's API server reads too: its `ceems_api_server` section gives the database
//! and the admins, `clusters` and `updaters` are the API server's and are skipped.

use serde::Deserialize;
use toml::{Table, Value};

#[derive(Debug, Deserialize)]
struct File {
    #[serde(default)]
    ceems_lb: Option<LbConfig>,
    #[serde(default)]
    ceems_api_server: Option<ApiServer>,
    #[serde(default)]
    #[allow(dead_code)]
    clusters: serde_norway::Value,
    #[serde(default)]
    #[allow(dead_code)]
    updaters: serde_norway::Value,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LbConfig {
    #[serde(default)]
    strategy: Option<String>,
    #[serde(default)]
    backends: Vec<BackendConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BackendConfig {
    id: String,
    #[serde(default)]
    tsdb_urls: Vec<String>,
    #[serde(default)]
    filter_labels: Vec<String>,
    #[serde(default)]
    pyro_urls: Vec<String>,
}

/// The API server's section: only where its data, its admins and its API are matter here.
#[derive(Debug, Default, Deserialize)]
struct ApiServer {
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    admin: Option<Admin>,
    #[serde(default)]
    web: Option<ApiWeb>,
}

#[derive(Debug, Deserialize)]
struct ApiWeb {
    #[serde(default)]
    url: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Data {
    #[serde(default)]
    path: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Admin {
    #[serde(default)]
    users: Vec<String>,
}

/// The `lb` table that CEEMS's YAML `text` means.
pub fn to_table(text: &str) -> Result<Table, String> {
    let file: Option<File> = serde_norway::from_str(text).map_err(|e| e.to_string())?;
    let (lb, api) = match file {
        Some(f) => (f.ceems_lb, f.ceems_api_server.unwrap_or_default()),
        None => (None, ApiServer::default()),
    };
    let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
    let mut table = Table::new();
    let mut lb_table = Table::new();
    if let Some(lb) = lb {
        if let Some(strategy) = lb.strategy {
            if !matches!(strategy.as_str(), "round-robin" | "least-connection") {
                return Err(format!(
                    "ceems_lb.strategy `{strategy}` is not supported: use round-robin or least-connection"
                ));
            }
            lb_table.insert("strategy".into(), Value::String(strategy));
        }
        let (mut backends, mut filters) = (Vec::new(), Vec::new());
        for b in lb.backends {
            if !b.pyro_urls.is_empty() {
                return Err(format!(
                    "ceems_lb.backends `{}`: pyro_urls: Pyroscope is not relayed by ceems lb",
                    b.id
                ));
            }
            backends.extend(b.tsdb_urls.iter().map(|u| format!("{}={u}", b.id)));
            filters.extend(b.filter_labels.iter().map(|l| format!("{}={l}", b.id)));
        }
        lb_table.insert("backends".into(), strings(backends));
        if !filters.is_empty() {
            lb_table.insert("filter-labels".into(), strings(filters));
        }
    }
    // As CEEMS's lb: the database when the file says where it is, else the server's API.
    let data_path = api.data.and_then(|d| d.path);
    if let (None, Some(url)) = (&data_path, api.web.and_then(|w| w.url)) {
        lb_table.insert("ceems-api-url".into(), Value::String(url));
    }
    table.insert("lb".into(), Value::Table(lb_table));
    if let Some(path) = data_path {
        let mut data = Table::new();
        data.insert("path".into(), Value::String(path));
        let mut storage = Table::new();
        storage.insert("data".into(), Value::Table(data));
        table.insert("storage".into(), Value::Table(storage));
    }
    if let Some(admin) = api.admin.filter(|a| !a.users.is_empty()) {
        let mut web = Table::new();
        web.insert("admin-users".into(), strings(admin.users));
        table.insert("web".into(), Value::Table(web));
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceems_documented_file_merged_with_the_api_servers() {
        let t = to_table(
            "ceems_api_server:\n  data:\n    path: /var/lib/ceems\n    update_interval: 15m\n  admin:\n    users:\n      - adm1\n  web:\n    url: http://localhost:9020\nclusters:\n  - id: slurm-0\n    manager: slurm\nceems_lb:\n  strategy: round-robin\n  backends:\n    - id: slurm-0\n      tsdb_urls:\n        - http://tsdb-0\n        - http://tsdb-0-replica\n      filter_labels: [hostname]\n",
        )
        .unwrap();
        assert_eq!(t["lb"]["strategy"].as_str(), Some("round-robin"));
        assert_eq!(
            t["lb"]["backends"],
            Value::Array(vec![
                Value::String("slurm-0=http://tsdb-0".into()),
                Value::String("slurm-0=http://tsdb-0-replica".into()),
            ])
        );
        assert_eq!(
            t["lb"]["filter-labels"][0].as_str(),
            Some("slurm-0=hostname")
        );
        assert_eq!(
            t["storage"]["data"]["path"].as_str(),
            Some("/var/lib/ceems")
        );
        assert_eq!(t["web"]["admin-users"][0].as_str(), Some("adm1"));
        // The database is named: the API's URL is not used.
        assert!(t["lb"].get("ceems-api-url").is_none());
    }

    /// CEEMS's `config-api.yml`: no database, the server's URL: ownership from its API.
    #[test]
    fn without_a_database_the_api_server_is_asked() {
        let t = to_table(
            "ceems_api_server:\n  web:\n    url: http://localhost:9020\nceems_lb:\n  backends:\n    - id: slurm-0\n      tsdb_urls: [http://localhost:9090]\n",
        )
        .unwrap();
        assert_eq!(
            t["lb"]["ceems-api-url"].as_str(),
            Some("http://localhost:9020")
        );
        assert!(t.get("storage").is_none());
    }

    #[test]
    fn what_we_do_not_do_is_said() {
        let e = to_table("ceems_lb:\n  strategy: resource-based\n").unwrap_err();
        assert!(e.contains("resource-based"), "{e}");
        let e = to_table("ceems_lb:\n  backends:\n    - id: a\n      pyro_urls: [http://p:4040]\n")
            .unwrap_err();
        assert!(e.contains("Pyroscope"), "{e}");
        let e = to_table("ceems_lb:\n  backend: []\n").unwrap_err();
        assert!(e.contains("backend"), "{e}");
    }
}
