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
    /// The stores with their client settings (CEEMS 0.10 and later).
    #[serde(default)]
    tsdb: Vec<StoreConfig>,
    #[serde(default)]
    filter_labels: Vec<String>,
    #[serde(default)]
    pyro_urls: Vec<String>,
    /// The Pyroscope servers with their client settings.
    #[serde(default)]
    pyroscope: Vec<StoreConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreConfig {
    web: StoreWeb,
    #[serde(default)]
    filter_labels: Vec<String>,
}

/// Prometheus's HTTP client settings, as far as the lb reads them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreWeb {
    url: String,
    #[serde(default)]
    basic_auth: Option<BasicAuth>,
    #[serde(default)]
    bearer_token: Option<String>,
    #[serde(default)]
    bearer_token_file: Option<String>,
    #[serde(default)]
    tls_config: Option<TlsConfig>,
    #[serde(default)]
    http_headers: std::collections::BTreeMap<String, HeaderValues>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BasicAuth {
    username: String,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    password_file: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsConfig {
    #[serde(default)]
    ca_file: Option<String>,
    #[serde(default)]
    cert_file: Option<String>,
    #[serde(default)]
    key_file: Option<String>,
    #[serde(default)]
    insecure_skip_verify: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderValues {
    #[serde(default)]
    values: Vec<String>,
    #[serde(default)]
    secrets: Vec<String>,
}

/// One `[[lb.stores]]` table from a backend's `tsdb` entry; files relative to `dir`.
fn store(cluster: &str, web: StoreWeb, dir: &std::path::Path) -> Table {
    let mut t = Table::new();
    let mut text = |k: &str, v: String| {
        t.insert(k.into(), Value::String(v));
    };
    let path = |p: String| dir.join(p).display().to_string();
    text("cluster", cluster.to_owned());
    text("url", web.url);
    if let Some(auth) = web.basic_auth {
        text("basic-auth-user", auth.username);
        if let Some(p) = auth.password {
            text("basic-auth-password", p);
        }
        if let Some(f) = auth.password_file {
            text("basic-auth-password-file", path(f));
        }
    }
    if let Some(token) = web.bearer_token {
        text("bearer-token", token);
    }
    if let Some(f) = web.bearer_token_file {
        text("bearer-token-file", path(f));
    }
    let mut skip = false;
    if let Some(tls) = web.tls_config {
        for (k, v) in [
            ("ca-file", tls.ca_file),
            ("cert-file", tls.cert_file),
            ("key-file", tls.key_file),
        ] {
            if let Some(v) = v {
                text(k, path(v));
            }
        }
        skip = tls.insecure_skip_verify;
    }
    if skip {
        t.insert("insecure-skip-verify".into(), Value::Boolean(true));
    }
    if !web.http_headers.is_empty() {
        let headers = web
            .http_headers
            .into_iter()
            .map(|(k, h)| {
                let all: Vec<String> = h.values.into_iter().chain(h.secrets).collect();
                (k, Value::String(all.join(", ")))
            })
            .collect();
        t.insert("headers".into(), Value::Table(headers));
    }
    t
}

/// The API server's section: only where its data, its admins and its API are matter here.
#[derive(Debug, Default, Deserialize)]
struct ApiServer {
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    admin: Option<Admin>,
    /// Where it is (`url`) and how the lb's client reaches it.
    #[serde(default)]
    web: Option<serde_norway::Mapping>,
}

/// The keys of the API server's `web` that say how a client reaches it; the others
/// (`requests_limit`, …) are the server's own.
const API_CLIENT_KEYS: &[&str] = &[
    "basic_auth",
    "bearer_token",
    "bearer_token_file",
    "tls_config",
    "http_headers",
];

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

/// The `lb` table that CEEMS's YAML `text` means; `dir` is its file's directory, which the
/// stores' certificate and password files are relative to.
pub fn to_table(text: &str, dir: &std::path::Path) -> Result<Table, String> {
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
        let (mut backends, mut filters, mut stores) = (Vec::new(), Vec::new(), Vec::new());
        let (mut pyroscope_backends, mut pyroscope_stores) = (Vec::new(), Vec::new());
        for b in lb.backends {
            pyroscope_backends.extend(b.pyro_urls.iter().map(|u| format!("{}={u}", b.id)));
            for s in b.pyroscope {
                pyroscope_stores.push(Value::Table(store(&b.id, s.web, dir)));
            }
            backends.extend(b.tsdb_urls.iter().map(|u| format!("{}={u}", b.id)));
            filters.extend(b.filter_labels.iter().map(|l| format!("{}={l}", b.id)));
            for s in b.tsdb {
                filters.extend(s.filter_labels.iter().map(|l| format!("{}={l}", b.id)));
                stores.push(Value::Table(store(&b.id, s.web, dir)));
            }
        }
        lb_table.insert("backends".into(), strings(backends));
        if !stores.is_empty() {
            lb_table.insert("stores".into(), Value::Array(stores));
        }
        if !pyroscope_backends.is_empty() {
            lb_table.insert("pyroscope-backends".into(), strings(pyroscope_backends));
        }
        if !pyroscope_stores.is_empty() {
            lb_table.insert("pyroscope-stores".into(), Value::Array(pyroscope_stores));
        }
        if !filters.is_empty() {
            lb_table.insert("filter-labels".into(), strings(filters));
        }
    }
    // As CEEMS's lb: the database when the file says where it is, else the server's API.
    let data_path = api.data.and_then(|d| d.path);
    if let (None, Some(mut web)) = (&data_path, api.web) {
        if let Some(serde_norway::Value::String(url)) = web.remove("url") {
            let mut client = serde_norway::Mapping::new();
            client.insert("url".into(), serde_norway::Value::String(String::new()));
            for key in API_CLIENT_KEYS {
                if let Some(v) = web.remove(*key) {
                    client.insert((*key).into(), v);
                }
            }
            let client: StoreWeb = serde_norway::from_value(serde_norway::Value::Mapping(client))
                .map_err(|e| format!("ceems_api_server.web: {e}"))?;
            let mut client = store("", client, dir);
            client.remove("cluster");
            client.remove("url");
            if !client.is_empty() {
                lb_table.insert("ceems-api-client".into(), Value::Table(client));
            }
            lb_table.insert("ceems-api-url".into(), Value::String(url));
        }
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
            std::path::Path::new("/etc/ceems"),
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
            std::path::Path::new("/etc/ceems"),
        )
        .unwrap();
        assert_eq!(
            t["lb"]["ceems-api-url"].as_str(),
            Some("http://localhost:9020")
        );
        assert!(t.get("storage").is_none());
        assert!(t["lb"].get("ceems-api-client").is_none());
        // Behind basic auth and its own CA.
        let t = to_table(
            "ceems_api_server:\n  web:\n    url: https://stats:9020\n    requests_limit: 30\n    basic_auth:\n      username: ceems\n      password_file: api.password\n    tls_config:\n      ca_file: ca.pem\nceems_lb:\n  backends:\n    - id: slurm-0\n      tsdb_urls: [http://localhost:9090]\n",
            std::path::Path::new("/etc/ceems"),
        )
        .unwrap();
        let client = t["lb"]["ceems-api-client"].as_table().unwrap();
        assert_eq!(client["basic-auth-user"].as_str(), Some("ceems"));
        assert_eq!(
            client["basic-auth-password-file"].as_str(),
            Some("/etc/ceems/api.password")
        );
        assert_eq!(client["ca-file"].as_str(), Some("/etc/ceems/ca.pem"));
        assert!(client.get("url").is_none() && client.get("cluster").is_none());
    }

    /// CEEMS's `config-with-auth.yml`: stores behind TLS and basic auth, with a header each.
    #[test]
    fn stores_with_credentials_become_our_stores() {
        let pack = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/ceems-api/pkg/lb/testdata/config-with-auth.yml"
        ))
        .unwrap();
        let t = to_table(&pack, std::path::Path::new("/etc/ceems_lb")).unwrap();
        let stores = t["lb"]["stores"].as_array().unwrap();
        assert_eq!(stores.len(), 2);
        let s = stores[1].as_table().unwrap();
        assert_eq!(s["cluster"].as_str(), Some("slurm-1"));
        assert_eq!(s["url"].as_str(), Some("https://localhost:9090"));
        assert_eq!(s["basic-auth-user"].as_str(), Some("prometheus"));
        assert_eq!(s["cert-file"].as_str(), Some("/etc/ceems_lb/localhost.crt"));
        assert_eq!(s["insecure-skip-verify"].as_bool(), Some(true));
        assert_eq!(
            s["headers"]["X-Ceems-Test-Header"].as_str(),
            Some("slurm-1")
        );
    }

    /// CEEMS's `config-tsdb-pyro.yml`: Pyroscope beside Prometheus for one cluster.
    #[test]
    fn pyroscope_servers_become_our_pyroscope_stores() {
        let pack = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/ceems-api/pkg/lb/testdata/config-tsdb-pyro.yml"
        ))
        .unwrap();
        let t = to_table(&pack, std::path::Path::new("/etc/ceems_lb")).unwrap();
        let stores = t["lb"]["pyroscope-stores"].as_array().unwrap();
        assert_eq!(stores.len(), 1);
        assert_eq!(stores[0]["cluster"].as_str(), Some("slurm-1"));
        assert_eq!(stores[0]["url"].as_str(), Some("http://localhost:4040"));
        assert_eq!(t["lb"]["stores"].as_array().unwrap().len(), 2);
        let t = to_table(
            "ceems_lb:\n  backends:\n    - id: a\n      pyro_urls: [http://p:4040]\n",
            std::path::Path::new("/etc/ceems"),
        )
        .unwrap();
        assert_eq!(
            t["lb"]["pyroscope-backends"][0].as_str(),
            Some("a=http://p:4040")
        );
    }

    #[test]
    fn what_we_do_not_do_is_said() {
        let e = to_table(
            "ceems_lb:\n  strategy: resource-based\n",
            std::path::Path::new("/etc/ceems"),
        )
        .unwrap_err();
        assert!(e.contains("resource-based"), "{e}");
        let e = to_table(
            "ceems_lb:\n  backend: []\n",
            std::path::Path::new("/etc/ceems"),
        )
        .unwrap_err();
        assert!(e.contains("backend"), "{e}");
    }
}
