//! The stats-server's settings: storage, Slurm, clusters and Prometheus.

use super::*;
use std::collections::BTreeMap;

use crate::manager::registry::{self, ClusterEntry};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) struct Storage {
    pub(super) data: DataSettings,
    pub(super) database_url: String,
    #[serde(deserialize_with = "config::de_duration")]
    pub(super) update_interval: Duration,
    #[serde(deserialize_with = "config::de_duration")]
    pub(super) first_window: Duration,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) struct DataSettings {
    pub(super) path: PathBuf,
    #[serde(deserialize_with = "config::de_duration")]
    pub(super) retention_period: Duration,
    pub(super) backup: BackupSettings,
}

/// How long jobs are kept, and the database's backups.
pub(super) fn retention_opts() -> Vec<Opt> {
    vec![
        Opt::new(
            "storage.data.retention-period",
            Kind::Duration,
            "Jobs that ended longer ago than this are deleted",
        )
        .default("1y"),
        Opt::new(
            "storage.data.backup.path",
            Kind::Str,
            "Directory for online backups of the database (empty: no backups)",
        )
        .default(""),
        Opt::new(
            "storage.data.backup.interval",
            Kind::Duration,
            "Time between two backups",
        )
        .default("1d"),
        Opt::new(
            "storage.data.backup.keep",
            Kind::Int,
            "Backups kept; older ones are deleted",
        )
        .default("7"),
    ]
}

#[derive(Debug, Deserialize)]
pub(super) struct BackupSettings {
    pub(super) path: String,
    #[serde(deserialize_with = "config::de_duration")]
    pub(super) interval: Duration,
    pub(super) keep: i64,
}

/// One `[[stats-server.clusters]]` entry: the keys every manager shares, and its manager's
/// own, which that manager's builder reads (`manager::registry`).
#[derive(Debug, Clone)]
pub(super) struct ClusterSettings {
    pub(super) id: String,
    /// Whose accounting this cluster's units come from: a name of `manager::registry`.
    pub(super) manager: String,
    pub(super) prometheus_url: Option<String>,
    /// CEEMS's updater queries (series → sub-key → template with `{{.UUIDs}}`): a cluster
    /// with them asks Prometheus only these (as CEEMS's `updaters` do).
    pub(super) series_queries: BTreeMap<String, BTreeMap<String, String>>,
    /// The rest of the entry, for its manager.
    pub(super) keys: toml::Table,
}

/// The shared keys of an entry.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct SharedKeys {
    id: String,
    #[serde(default = "slurm_manager")]
    manager: String,
    #[serde(default)]
    prometheus_url: Option<String>,
    #[serde(default)]
    series_queries: BTreeMap<String, BTreeMap<String, String>>,
}

fn slurm_manager() -> String {
    crate::manager::slurm::MANAGER.to_owned()
}

impl ClusterSettings {
    /// What its manager's builder reads.
    pub(super) fn entry<'a>(&'a self, settings: &'a Layered) -> ClusterEntry<'a> {
        ClusterEntry {
            id: &self.id,
            keys: self.keys.clone(),
            settings,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) struct PrometheusSettings {
    pub(super) url: String,
    #[serde(deserialize_with = "config::de_duration")]
    pub(super) timeout: Duration,
    #[serde(deserialize_with = "config::de_duration")]
    pub(super) cutoff: Duration,
    pub(super) max_batch: i64,
    pub(super) max_samples: i64,
    pub(super) parallel_queries: i64,
    #[serde(deserialize_with = "config::de_duration")]
    pub(super) update_budget: Duration,
    #[serde(deserialize_with = "config::de_duration")]
    pub(super) yield_to_api: Duration,
    #[serde(deserialize_with = "config::de_duration")]
    pub(super) scrape_interval: Duration,
    #[serde(deserialize_with = "config::de_duration")]
    pub(super) query_delay: Duration,
    #[serde(default)]
    pub(super) queries: Queries,
}

/// Where clusters are configured, one example entry per manager, for `--help`.
pub(super) fn clusters_help() -> String {
    let mut text = String::from(
        "\
Clusters: without a config file, the --slurm.* flags describe one Slurm cluster. Several
clusters, or any that is not Slurm, go in the TOML file of --config.file: one
[[stats-server.clusters]] table each (examples/ceems.toml has them all), sharing one database.
One line each, as a `clusters = [ ... ]` array of the [stats-server] table:
",
    );
    for spec in registry::ACCOUNTINGS {
        text.push_str(&format!(
            "  {:<11} {}\n",
            format!("{}:", spec.manager),
            spec.example
        ));
    }
    text.push_str(
        "Any entry may set prometheus-url. `ceems check-privileges stats-server` tests what each needs.",
    );
    text
}

/// The clusters of the configuration: the `clusters` list, or the one Slurm cluster of
/// `--slurm.*`.
pub(super) fn clusters(settings: &Layered) -> anyhow::Result<Vec<ClusterSettings>> {
    let tables: Vec<toml::Table> = match settings.table.contains_key("clusters") {
        true => settings.get("clusters")?,
        false => {
            let id: String = settings.get("slurm.cluster-id")?;
            let id = match id.is_empty() {
                true => default_slurm_cluster_id(),
                false => id,
            };
            vec![toml::Table::from_iter([(
                "id".to_owned(),
                toml::Value::String(id),
            )])]
        }
    };
    let mut list = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for mut keys in tables {
        let shared: toml::Table = registry::SHARED_KEYS
            .iter()
            .filter_map(|k| keys.remove(*k).map(|v| ((*k).to_owned(), v)))
            .collect();
        let shared: SharedKeys = toml::Value::Table(shared)
            .try_into()
            .map_err(|e| anyhow::anyhow!("clusters: an entry: {e}"))?;
        anyhow::ensure!(!shared.id.is_empty(), "clusters: an entry has an empty id");
        anyhow::ensure!(
            seen.insert(shared.id.clone()),
            "clusters: id `{}` appears twice",
            shared.id
        );
        anyhow::ensure!(
            registry::accounting_spec(&shared.manager).is_some(),
            "clusters: `{}`: manager `{}` is not one the stats-server reads ({})",
            shared.id,
            shared.manager,
            registry::manager_names()
        );
        list.push(ClusterSettings {
            id: shared.id,
            manager: shared.manager,
            prometheus_url: shared.prometheus_url,
            series_queries: shared.series_queries,
            keys,
        });
    }
    Ok(list)
}

/// The one Slurm cluster's id when none is given: the ClusterName of its slurm.conf, as sacct
/// and the accounting database know it, so that the lb's and cacct's ids can be Slurm's.
fn default_slurm_cluster_id() -> String {
    let path = crate::manager::slurm::conf::slurm_conf_path(&[]);
    match crate::manager::slurm::conf::cluster_name_at(&path) {
        Ok(name) => {
            tracing::info!(cluster_id = %name, conf = %path.display(), "cluster id is Slurm's ClusterName (--slurm.cluster-id sets another)");
            name
        }
        Err(why) => {
            tracing::warn!(reason = %why, "cluster id is `slurm-0`: set --slurm.cluster-id to the name the lb and cacct use");
            "slurm-0".to_owned()
        }
    }
}

/// Each cluster's accounting, built by its manager from its entry.
pub(super) fn accounting(
    c: &ClusterSettings,
    settings: &Layered,
) -> anyhow::Result<std::sync::Arc<dyn crate::manager::Accounting>> {
    let spec = registry::accounting_spec(&c.manager)
        .with_context(|| format!("clusters: `{}`: no manager `{}`", c.id, c.manager))?;
    Ok((spec.build)(&c.entry(settings))?)
}

/// The capabilities the stats-server keeps: CAP_SETUID/CAP_SETGID to run Slurm's commands as
/// a user.
pub fn needed_capabilities(settings: &Layered) -> anyhow::Result<Vec<caps::Capability>> {
    Ok(crate::manager::slurm::setup::needed_capabilities(settings)?)
}

/// Every cluster entry with its manager's name, for check-privileges.
pub fn cluster_entries(settings: &Layered) -> anyhow::Result<Vec<(String, String, toml::Table)>> {
    Ok(clusters(settings)?
        .into_iter()
        .map(|c| (c.id, c.manager, c.keys))
        .collect())
}

/// `[stats-server.notify]`: digests of findings mailed to users.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) struct NotifySettings {
    #[serde(flatten)]
    pub(super) mail: super::super::mail_opts::MailSettings,
    #[serde(deserialize_with = "config::de_duration")]
    pub(super) period: Duration,
    pub(super) min_severity: crate::store::findings::Severity,
    pub(super) opt_out: Vec<String>,
    pub(super) eml_dir: String,
}

impl NotifySettings {
    /// The notifier, or None when neither an SMTP server nor a dry-run directory is set.
    pub(super) fn notifier(
        &self,
        base_url: String,
        aggregated_clusters: std::collections::HashSet<String>,
        thresholds: crate::store::findings::Thresholds,
    ) -> anyhow::Result<Option<Notifier>> {
        let delivery = if !self.eml_dir.is_empty() {
            tracing::info!(dir = %self.eml_dir, "digests are written as .eml files, not sent (--notify.eml-dir)");
            Delivery::Directory(PathBuf::from(&self.eml_dir))
        } else {
            match self.mail.server()? {
                Some(server) => {
                    tracing::info!(host = %server.host, port = server.port, tls = ?server.security, "digests go to the SMTP server");
                    self.mail.delivery(&server)?
                }
                None => return Ok(None),
            }
        };
        anyhow::ensure!(
            self.period >= Duration::from_secs(1),
            "notify.period must be at least 1s"
        );
        Ok(Some(Notifier {
            from: self.mail.sender()?,
            addresses: self.mail.addresses()?,
            min_severity: self.min_severity,
            opt_out: self
                .opt_out
                .iter()
                .filter(|u| !u.is_empty())
                .cloned()
                .collect(),
            base_url,
            aggregated_clusters,
            delivery,
            period: self.period,
            thresholds,
        }))
    }
}

/// `--web.external-url`, else this host's name and the port listened on.
pub(super) fn external_url(configured: &str, listen: &str) -> String {
    if !configured.is_empty() {
        return configured.trim_end_matches('/').to_owned();
    }
    let port = listen.rsplit(':').next().unwrap_or("9020");
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("http://{host}:{port}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example lines of `--help`, as an operator would paste them into a config file.
    #[test]
    fn every_example_cluster_of_the_help_is_a_valid_entry() {
        let help = clusters_help();
        let lines: Vec<&str> = help
            .lines()
            .filter_map(|l| l.split_once(": ").map(|(_, entry)| entry.trim()))
            .filter(|entry| entry.starts_with('{'))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ceems.toml");
        let text = format!("[stats-server]\nclusters = [\n{}\n]\n", lines.join(",\n"));
        std::fs::write(&file, &text).unwrap();
        let matches = super::super::command()
            .try_get_matches_from(["stats-server", "--config.file", file.to_str().unwrap()])
            .unwrap();
        let settings = config::load("stats-server", &super::super::opts(), &matches)
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        let list = clusters(&settings).unwrap_or_else(|e| panic!("{e:#}\n{text}"));
        let managers: Vec<&str> = list.iter().map(|c| c.manager.as_str()).collect();
        let every: Vec<&str> = registry::ACCOUNTINGS.iter().map(|s| s.manager).collect();
        assert_eq!(managers, every, "{help}");
        for c in &list {
            let spec = registry::accounting_spec(&c.manager).unwrap();
            let parsed = (spec.build)(&c.entry(&settings));
            // Building may look for the manager's commands; an entry's keys are never the cause.
            if let Err(e) = parsed {
                assert!(!e.message.contains("unknown field"), "{e}");
            }
        }
    }
}
