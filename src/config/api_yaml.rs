//! CEEMS's API server configuration file (YAML: `ceems_api_server`, `clusters`, `updaters`),
//! read as the `stats-server` table of the shared loader, so that a CEEMS site starts
//! `ceems stats-server --config.file=config.yml` with the file it has. A key this reading
//! does not carry over stops the start and is named, rather than being silently dropped.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::{Table, Value};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    ceems_api_server: ApiServer,
    #[serde(default)]
    clusters: Vec<ClusterConfig>,
    #[serde(default)]
    updaters: Vec<UpdaterConfig>,
    /// ceems's policies (not CEEMS's), beside its sections; keys as in TOML, `_` or `-`.
    #[serde(default)]
    policies: Vec<toml::Table>,
    /// ceems's site rules of the findings, likewise.
    #[serde(default)]
    finding_rules: Vec<toml::Table>,
    /// The load balancer's section, when the file is shared with `ceems_lb`.
    #[serde(default)]
    #[allow(dead_code)]
    ceems_lb: serde_norway::Value,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApiServer {
    #[serde(default)]
    data: Data,
    #[serde(default)]
    admin: Admin,
    #[serde(default)]
    #[allow(dead_code)]
    web: ApiWeb,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Data {
    path: Option<String>,
    backup_path: Option<String>,
    backup_interval: Option<String>,
    retention_period: Option<String>,
    update_interval: Option<String>,
    /// CEEMS splits a long gap into windows this long; each pull here covers the whole gap.
    #[allow(dead_code)]
    max_update_interval: Option<String>,
    time_zone: Option<String>,
    /// `2024-09-08T00:00:00Z`: where the first pull of an empty database starts.
    update_from: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Admin {
    #[serde(default)]
    users: Vec<String>,
}

/// `requests_limit` applies; the rest is read so that an unknown key is named.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApiWeb {
    /// CEEMS's rate limit per client (`--web.max-requests`).
    requests_limit: Option<u64>,
    /// Where `ceems_lb` reaches this server, in a file the two share; the server listens at
    /// `--web.listen-address`.
    #[allow(dead_code)]
    url: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterConfig {
    id: String,
    manager: String,
    #[serde(default)]
    updaters: Vec<String>,
    #[serde(default)]
    cli: Option<Cli>,
    #[serde(default)]
    web: Option<ClusterWeb>,
    #[serde(default)]
    extra_config: Option<ExtraConfig>,
}

/// A cluster's HTTP client (Prometheus's client settings), for OpenStack's APIs.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterWeb {
    #[serde(default)]
    http_headers: BTreeMap<String, HeaderValues>,
    #[serde(default)]
    tls_config: Option<TlsConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderValues {
    #[serde(default)]
    values: Vec<String>,
    #[serde(default)]
    secrets: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsConfig {
    ca_file: Option<String>,
    cert_file: Option<String>,
    key_file: Option<String>,
    #[serde(default)]
    insecure_skip_verify: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cli {
    path: Option<String>,
    #[serde(default)]
    environment_variables: BTreeMap<String, String>,
}

/// Kubernetes' and OpenStack's `extra_config`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExtraConfig {
    api_service_endpoints: Option<Endpoints>,
    /// Keystone's `auth` object, posted as written.
    auth: Option<serde_norway::Value>,
    kubeconfig_file: Option<String>,
    ns_users_list_file: Option<String>,
    #[serde(default)]
    gpu_resource_names: Vec<String>,
    #[serde(default)]
    project_annotations: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Endpoints {
    compute: String,
    identity: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdaterConfig {
    id: String,
    updater: String,
    web: UpdaterWeb,
    #[serde(default)]
    extra_config: UpdaterExtra,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdaterWeb {
    url: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdaterExtra {
    cutoff_duration: Option<String>,
    query_batch_size: Option<u64>,
    #[serde(default)]
    queries: BTreeMap<String, BTreeMap<String, String>>,
}

/// The `stats-server` table that CEEMS's YAML `text` means, `now` the time `update_from` is
/// measured back from.
pub fn to_table(text: &str, now: i64) -> Result<Table, String> {
    let file: File = serde_norway::from_str(text).map_err(|e| e.to_string())?;
    let mut table = Table::new();
    let api = file.ceems_api_server;
    let data = api.data;
    let mut set = |key: &str, v: Option<Value>| {
        if let Some(v) = v {
            insert(&mut table, key, v);
        }
    };
    let text = |s: Option<String>| s.map(Value::String);
    set("storage.data.path", text(data.path));
    set("storage.data.backup.path", text(data.backup_path));
    set("storage.data.backup.interval", text(data.backup_interval));
    set("storage.data.retention-period", text(data.retention_period));
    set("storage.data.time-zone", text(data.time_zone));
    set("storage.update-interval", text(data.update_interval));
    if let Some(from) = data.update_from {
        let t: jiff::Timestamp = from
            .parse()
            .map_err(|e| format!("ceems_api_server.data.update_from `{from}`: {e}"))?;
        set(
            "storage.first-window",
            Some(Value::String(format!("{}s", (now - t.as_second()).max(0)))),
        );
    }
    set(
        "web.max-requests",
        api.web
            .requests_limit
            .map(|n| Value::Integer(i64::try_from(n).unwrap_or(i64::MAX))),
    );
    if !api.admin.users.is_empty() {
        let users = api.admin.users.into_iter().map(Value::String).collect();
        set("web.admin-users", Some(Value::Array(users)));
    }
    let updaters: BTreeMap<&str, &UpdaterConfig> =
        file.updaters.iter().map(|u| (u.id.as_str(), u)).collect();
    for u in &file.updaters {
        if u.updater != "tsdb" {
            return Err(format!(
                "updaters `{}`: updater `{}` is not supported: tsdb is",
                u.id, u.updater
            ));
        }
    }
    let cutoffs: std::collections::BTreeSet<&str> = file
        .updaters
        .iter()
        .filter_map(|u| u.extra_config.cutoff_duration.as_deref())
        .collect();
    match cutoffs.len() {
        0 => {}
        1 => set(
            "prometheus.cutoff",
            cutoffs.first().map(|c| Value::String((*c).to_owned())),
        ),
        _ => {
            return Err(format!(
            "updaters: cutoff_duration differs ({cutoffs:?}); one is used for every cluster here"
        ))
        }
    }
    if let Some(batch) = file
        .updaters
        .iter()
        .filter_map(|u| u.extra_config.query_batch_size)
        .min()
    {
        set("prometheus.max-batch", Some(Value::Integer(batch as i64)));
    }
    let mut clusters = Vec::new();
    for c in file.clusters {
        clusters.push(Value::Table(cluster(c, &updaters)?));
    }
    set("clusters", Some(Value::Array(clusters)));
    // ceems's own sections beside CEEMS's, keys as TOML spells them.
    for (key, items) in [
        ("policies", file.policies),
        ("finding-rules", file.finding_rules),
    ] {
        if items.is_empty() {
            continue;
        }
        let items = items
            .into_iter()
            .map(|p| {
                Value::Table(
                    p.into_iter()
                        .map(|(k, v)| (k.replace('_', "-"), v))
                        .collect(),
                )
            })
            .collect();
        set(key, Some(Value::Array(items)));
    }
    Ok(table)
}

/// Where CEEMS reads a Kubernetes cluster's namespaces' users when its config names no file.
const CEEMS_NS_USERS_FILE: &str = "/var/run/ceems/users.yaml";

/// One `[[clusters]]` entry of ours from one of CEEMS's.
fn cluster(c: ClusterConfig, updaters: &BTreeMap<&str, &UpdaterConfig>) -> Result<Table, String> {
    let at = |key: &str| format!("clusters `{}`: {key}", c.id);
    let mut t = Table::new();
    t.insert("id".into(), Value::String(c.id.clone()));
    let manager = match c.manager.as_str() {
        "slurm" | "lsf" | "k8s" | "openstack" => c.manager.clone(),
        other => {
            return Err(format!(
            "{}: `{other}` is not supported (slurm, lsf, k8s and openstack are; openpbs in our TOML file)",
            at("manager")
        ))
        }
    };
    t.insert("manager".into(), Value::String(manager.clone()));
    if let Some(web) = c.web {
        if manager != "openstack" {
            return Err(format!(
                "{}: HTTP client settings are read for OpenStack clusters only",
                at("web")
            ));
        }
        let mut headers = Table::new();
        for (name, h) in web.http_headers {
            let all: Vec<String> = h.values.into_iter().chain(h.secrets).collect();
            headers.insert(name, Value::String(all.join(", ")));
        }
        if !headers.is_empty() {
            t.insert("openstack-http-headers".into(), Value::Table(headers));
        }
        if let Some(tls) = web.tls_config {
            for (key, v) in [
                ("openstack-ca-file", tls.ca_file),
                ("openstack-cert-file", tls.cert_file),
                ("openstack-key-file", tls.key_file),
            ] {
                if let Some(v) = v {
                    t.insert(key.into(), Value::String(v));
                }
            }
            if tls.insecure_skip_verify {
                t.insert(
                    "openstack-insecure-skip-verify".into(),
                    Value::Boolean(true),
                );
            }
        }
    }
    if let Some(cli) = c.cli {
        if !cli.environment_variables.is_empty() {
            let key = match manager.as_str() {
                "slurm" => "slurm-env",
                "lsf" => "lsf-env",
                _ => {
                    return Err(format!(
                        "{}: only Slurm and LSF clusters run commands",
                        at("cli.environment_variables")
                    ))
                }
            };
            let env = cli
                .environment_variables
                .into_iter()
                .map(|(k, v)| Value::String(format!("{k}={v}")))
                .collect();
            t.insert(key.into(), Value::Array(env));
        }
        if let Some(dir) = cli.path {
            let dir = std::path::Path::new(&dir);
            let path = |cmd: &str| Value::String(dir.join(cmd).display().to_string());
            match manager.as_str() {
                // Its bacct and bjobs.
                "lsf" => {
                    t.insert(
                        "lsf-bin-dir".into(),
                        Value::String(dir.display().to_string()),
                    );
                }
                _ => {
                    t.insert("sacct-path".into(), path("sacct"));
                    t.insert("sacctmgr-path".into(), path("sacctmgr"));
                }
            }
        }
    }
    if let Some(mut extra) = c.extra_config {
        if manager == "openstack" {
            let endpoints = extra.api_service_endpoints.take().ok_or_else(|| {
                format!(
                    "{}: compute and identity are needed",
                    at("extra_config.api_service_endpoints")
                )
            })?;
            t.insert(
                "openstack-compute-url".into(),
                Value::String(endpoints.compute),
            );
            t.insert(
                "openstack-identity-url".into(),
                Value::String(endpoints.identity),
            );
            let auth = extra.auth.take().ok_or_else(|| {
                format!(
                    "{}: Keystone's credentials are needed",
                    at("extra_config.auth")
                )
            })?;
            let auth =
                Value::try_from(auth).map_err(|e| format!("{}: {e}", at("extra_config.auth")))?;
            t.insert("openstack-auth".into(), auth);
        } else if manager != "k8s" {
            return Err(format!(
                "{}: only Kubernetes and OpenStack clusters take one",
                at("extra_config")
            ));
        } else if extra.api_service_endpoints.is_some() || extra.auth.is_some() {
            return Err(format!(
                "{}: api_service_endpoints and auth are OpenStack's",
                at("extra_config")
            ));
        }
        if let Some(f) = extra.ns_users_list_file {
            t.insert("k8s-ns-users-file".into(), Value::String(f));
        }
        let list = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
        if let Some(k) = extra.kubeconfig_file {
            t.insert("kubeconfig".into(), Value::String(k));
        }
        if !extra.gpu_resource_names.is_empty() {
            t.insert("k8s-gpu-resources".into(), list(extra.gpu_resource_names));
        }
        if !extra.project_annotations.is_empty() {
            t.insert(
                "k8s-project-annotations".into(),
                list(extra.project_annotations),
            );
        }
    }
    // CEEMS reads its default users file when none is named (nothing when it is absent).
    if manager == "k8s" && !t.contains_key("k8s-ns-users-file") {
        t.insert(
            "k8s-ns-users-file".into(),
            Value::String(CEEMS_NS_USERS_FILE.to_owned()),
        );
    }
    let mut url: Option<&str> = None;
    let mut series = Table::new();
    for id in &c.updaters {
        let u = updaters
            .get(id.as_str())
            .ok_or_else(|| format!("{}: no updater `{id}` in updaters", at("updaters")))?;
        match url {
            Some(other) if other != u.web.url => {
                return Err(format!(
                    "{}: `{other}` and `{}`: one TSDB per cluster here",
                    at("updaters"),
                    u.web.url
                ))
            }
            _ => url = Some(&u.web.url),
        }
        for (name, subs) in &u.extra_config.queries {
            let entry = series
                .entry(name.clone())
                .or_insert_with(|| Value::Table(Table::new()));
            if let Value::Table(entry) = entry {
                for (sub, q) in subs {
                    entry.insert(sub.clone(), Value::String(q.clone()));
                }
            }
        }
    }
    if let Some(url) = url {
        t.insert("prometheus-url".into(), Value::String(url.to_owned()));
        t.insert("series-queries".into(), Value::Table(series));
    }
    Ok(t)
}

/// Sets `dotted.key` in `table`, making the tables on the way.
fn insert(table: &mut Table, key: &str, v: Value) {
    match key.split_once('.') {
        None => {
            table.insert(key.to_owned(), v);
        }
        Some((head, rest)) => {
            let sub = table
                .entry(head.to_owned())
                .or_insert_with(|| Value::Table(Table::new()));
            if let Value::Table(sub) = sub {
                insert(sub, rest, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PACK: &str = "ceems_api_server:
  data:
    path: /var/lib/ceems
    backup_path: /var/backups/ceems
    time_zone: 'Europe/Paris'
    max_update_interval: 24h
    update_from: '2026-11-25T00:00:00Z'
  admin:
    users: [grafana, __test_admin]
  web:
    requests_limit: 30
    url: http://localhost:9020
clusters:
  - id: slurm-0
    manager: slurm
    updaters: [tsdb-0, tsdb-1]
    cli:
      path: pkg/api/testdata
  - id: k8s-1
    manager: k8s
    updaters: [tsdb-0]
    extra_config:
      kubeconfig_file: pkg/api/testdata/k8s/kubeconfig.yaml
      gpu_resource_names: [nvidia.com/gpu]
      project_annotations: [ceems.io/project]
updaters:
  - id: tsdb-0
    updater: tsdb
    web:
      url: http://localhost:9090
    extra_config:
      cutoff_duration: 0s
      queries:
        avg_cpu_usage:
          global: avg_cpu_usage{uuid=~\"{{.UUIDs}}\"}
  - id: tsdb-1
    updater: tsdb
    web:
      url: http://localhost:9090
    extra_config:
      cutoff_duration: 0s
      queries:
        total_io_read_stats:
          bytes: total_io_read_stats_bytes{uuid=~\"{{.UUIDs}}\"}
          requests: total_io_read_stats_requests{uuid=~\"{{.UUIDs}}\"}
";

    #[test]
    fn the_packs_file_becomes_our_table() {
        let now = 1_795_651_200; // 2026-11-26T00:00:00Z
        let t = to_table(PACK, now).unwrap();
        let get = |path: &str| {
            let mut v = Value::Table(t.clone());
            for k in path.split('.') {
                v = v.get(k)?.clone();
            }
            Some(v)
        };
        assert_eq!(
            get("storage.data.path"),
            Some(Value::from("/var/lib/ceems"))
        );
        assert_eq!(
            get("storage.data.time-zone"),
            Some(Value::from("Europe/Paris"))
        );
        assert_eq!(get("storage.first-window"), Some(Value::from("86400s")));
        assert_eq!(get("prometheus.cutoff"), Some(Value::from("0s")));
        let clusters = t["clusters"].as_array().unwrap();
        let slurm = clusters[0].as_table().unwrap();
        assert_eq!(slurm["sacct-path"].as_str(), Some("pkg/api/testdata/sacct"));
        assert_eq!(
            slurm["prometheus-url"].as_str(),
            Some("http://localhost:9090")
        );
        let series = slurm["series-queries"].as_table().unwrap();
        assert_eq!(series.len(), 2);
        assert_eq!(series["total_io_read_stats"].as_table().unwrap().len(), 2);
        let k8s = clusters[1].as_table().unwrap();
        assert_eq!(
            k8s["kubeconfig"].as_str(),
            Some("pkg/api/testdata/k8s/kubeconfig.yaml")
        );
        // CEEMS's default path where a cluster names none.
        assert_eq!(
            k8s["k8s-ns-users-file"].as_str(),
            Some("/var/run/ceems/users.yaml")
        );
        assert_eq!(k8s["series-queries"].as_table().unwrap().len(), 1);
    }

    #[test]
    fn a_slurm_clusters_environment_is_carried_over() {
        let text = PACK.replacen(
            "    cli:\n      path: pkg/api/testdata",
            "    cli:\n      path: pkg/api/testdata\n      environment_variables:\n        SLURM_CONF: /etc/slurm/b.conf",
            1,
        );
        assert_ne!(text, PACK);
        let t = to_table(&text, 0).unwrap();
        let slurm = t["clusters"][0].as_table().unwrap();
        assert_eq!(
            slurm["slurm-env"].as_array().unwrap()[0].as_str(),
            Some("SLURM_CONF=/etc/slurm/b.conf")
        );
    }

    #[test]
    fn an_openstack_cloud_is_carried_over_with_its_credentials_and_headers() {
        let cloud = "  - id: os-1
    manager: openstack
    updaters: [tsdb-0]
    web:
      http_headers:
        X-OpenStack-Nova-API-Version:
          values: [latest]
      tls_config:
        ca_file: /etc/ceems/cloud-ca.pem
    extra_config:
      api_service_endpoints:
        compute: https://nova:8774/v2.1
        identity: https://keystone:5000
      auth:
        identity:
          methods: [application_credential]
          application_credential:
            id: 21dced0fd20347869b93710d2b98aae0
            secret: supersecret
";
        let text = PACK.replacen(
            "updaters:\n  - id: tsdb-0",
            &format!("{cloud}updaters:\n  - id: tsdb-0"),
            1,
        );
        assert_ne!(text, PACK);
        let t = to_table(&text, 0).unwrap();
        let os = t["clusters"][2].as_table().unwrap();
        assert_eq!(os["manager"].as_str(), Some("openstack"));
        assert_eq!(
            os["openstack-compute-url"].as_str(),
            Some("https://nova:8774/v2.1")
        );
        assert_eq!(
            os["openstack-ca-file"].as_str(),
            Some("/etc/ceems/cloud-ca.pem")
        );
        assert_eq!(
            os["openstack-http-headers"]["X-OpenStack-Nova-API-Version"].as_str(),
            Some("latest")
        );
        assert_eq!(
            os["openstack-auth"]["identity"]["application_credential"]["secret"].as_str(),
            Some("supersecret")
        );
    }

    /// CEEMS 0.14's LSF clusters: `cli.path` is where `bacct` and `bjobs` are, and its
    /// environment variables go with them.
    #[test]
    fn lsf_clusters_name_their_commands_directory() {
        let t = to_table(
            "ceems_api_server: {}\nclusters:\n  - id: lsf-0\n    manager: lsf\n    cli:\n      path: /opt/lsf/bin\n      environment_variables:\n        LSF_ENVDIR: /opt/lsf/conf\n",
            0,
        )
        .unwrap();
        let lsf = &t["clusters"][0];
        assert_eq!(lsf["manager"].as_str(), Some("lsf"));
        assert_eq!(lsf["lsf-bin-dir"].as_str(), Some("/opt/lsf/bin"));
        assert_eq!(lsf["lsf-env"][0].as_str(), Some("LSF_ENVDIR=/opt/lsf/conf"));
        assert!(lsf.get("sacct-path").is_none());
    }

    #[test]
    fn finding_rules_beside_ceems_sections_are_read_as_in_toml() {
        let text = "ceems_api_server: {}\nfinding_rules:\n  - id: short_gpu_job\n    when: job.alloc_gpus > 0\n    message: m\n";
        let table = to_table(text, 0).unwrap();
        let rules =
            crate::store::rules::SiteRules::parse(table["finding-rules"].clone(), None).unwrap();
        assert_eq!(rules.len(), 1);
    }

    #[test]
    fn policies_beside_ceems_sections_are_read_as_in_toml() {
        let text = "ceems_api_server: {}\npolicies:\n  - name: idle-gpus\n    warn_after: [1h]\n    dry_run: false\n";
        let table = to_table(text, 0).unwrap();
        let policies = crate::policy::config::parse(table["policies"].clone()).unwrap();
        assert_eq!(policies[0].name, "idle-gpus");
        assert!(!policies[0].dry_run);
        assert_eq!(
            policies[0].warn_after,
            [std::time::Duration::from_secs(3600)]
        );
    }

    #[test]
    fn what_is_not_carried_over_is_named() {
        for (edit, says) in [
            (("manager: k8s", "manager: openpbs"), "`openpbs` is not supported"),
            (("manager: k8s", "manager: openstack"), "compute and identity are needed"),
            (("    max_update_interval: 24h", "    bogus_key: 1"), "bogus_key"),
            (("updater: tsdb\n    web:\n      url: http://localhost:9090\n    extra_config:\n      cutoff_duration: 0s\n      queries:\n        total", "updater: tsdb\n    web:\n      url: http://other:9090\n    extra_config:\n      cutoff_duration: 0s\n      queries:\n        total"), "one TSDB per cluster"),
        ] {
            let text = PACK.replacen(edit.0, edit.1, 1);
            assert_ne!(text, PACK, "{says}");
            let e = to_table(&text, 0).unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
        }
    }
}
