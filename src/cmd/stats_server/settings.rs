//! The stats-server's settings: storage, Slurm, clusters and Prometheus.

use super::*;

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

#[derive(Debug, Deserialize)]
pub(super) struct BackupSettings {
    pub(super) path: String,
    #[serde(deserialize_with = "config::de_duration")]
    pub(super) interval: Duration,
    pub(super) keep: i64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) struct SlurmSettings {
    pub(super) source: String,
    pub(super) slurmrestd: SlurmrestdSettings,
    pub(super) sacct: SacctSettings,
    pub(super) sacctmgr: PathSetting,
    pub(super) cluster_id: String,
    pub(super) run_as_user: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) struct SlurmrestdSettings {
    pub(super) url: String,
    pub(super) api_version: String,
    pub(super) token_file: String,
    pub(super) user: String,
    #[serde(deserialize_with = "config::de_duration")]
    pub(super) timeout: Duration,
}

impl SlurmSettings {
    /// slurmrestd's client when it is the source, checked; None for sacct.
    pub(super) fn rest(&self) -> anyhow::Result<Option<RestAccounting>> {
        match self.source.as_str() {
            "sacct" => return Ok(None),
            "slurmrestd" => {}
            other => anyhow::bail!("--slurm.source `{other}`: sacct or slurmrestd"),
        }
        let r = &self.slurmrestd;
        anyhow::ensure!(
            !r.url.is_empty(),
            "--slurm.source=slurmrestd needs --slurm.slurmrestd.url"
        );
        let endpoint = r
            .url
            .parse()
            .map_err(|e| anyhow::anyhow!("--slurm.slurmrestd.url {e}"))?;
        if let Some((v, why)) = rest::REFUSED_VERSIONS
            .iter()
            .find(|(v, _)| *v == r.api_version)
        {
            anyhow::bail!("--slurm.slurmrestd.api-version {v} is not read: {why}; use v0.0.38");
        }
        anyhow::ensure!(
            rest::VERSIONS.contains(&r.api_version.as_str()),
            "--slurm.slurmrestd.api-version `{}`: one of {}",
            r.api_version,
            rest::VERSIONS.join(", ")
        );
        let jwt = match (r.token_file.is_empty(), r.user.is_empty()) {
            (true, true) => None,
            (false, false) => Some(rest::Jwt {
                user: r.user.clone(),
                token_file: PathBuf::from(&r.token_file),
            }),
            _ => anyhow::bail!(
                "--slurm.slurmrestd.token-file and --slurm.slurmrestd.user go together"
            ),
        };
        Ok(Some(RestAccounting {
            endpoint,
            version: r.api_version.clone(),
            jwt,
            slurm_name: None,
            timeout: r.timeout,
        }))
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct SacctSettings {
    pub(super) path: PathBuf,
    #[serde(deserialize_with = "config::de_duration")]
    pub(super) timeout: Duration,
}

#[derive(Debug, Deserialize)]
pub(super) struct PathSetting {
    pub(super) path: String,
}

/// One `[[stats-server.clusters]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct ClusterSettings {
    pub(super) id: String,
    /// Whose accounting this cluster's jobs come from: `slurm`, `lsf`, `k8s` or `openpbs`.
    #[serde(default = "slurm_manager")]
    pub(super) manager: String,
    /// LSF: the directory of `bacct` and `bjobs` (None: found on PATH).
    #[serde(default)]
    pub(super) lsf_bin_dir: Option<PathBuf>,
    /// LSF: `NAME=value` variables its commands need (`LSF_ENVDIR=/opt/lsf/conf`).
    #[serde(default)]
    pub(super) lsf_env: Vec<String>,
    /// OpenPBS: the server's accounting log directory (None: `PBS_HOME/server_priv/accounting`
    /// from /etc/pbs.conf).
    #[serde(default)]
    pub(super) openpbs_accounting_dir: Option<PathBuf>,
    /// OpenPBS: the directory of `qstat` (None: `PBS_EXEC/bin` from /etc/pbs.conf, else PATH).
    #[serde(default)]
    pub(super) openpbs_bin_dir: Option<PathBuf>,
    /// OpenPBS: `NAME=value` variables its commands need (`PBS_CONF_FILE=/etc/pbs.conf`).
    #[serde(default)]
    pub(super) openpbs_env: Vec<String>,
    /// Kubernetes: the API server's kubeconfig (None: the in-cluster service account).
    #[serde(default)]
    pub(super) kubeconfig: Option<PathBuf>,
    /// Kubernetes: annotations naming a pod's user (default `ceems.io/created-by`).
    #[serde(default)]
    pub(super) k8s_user_annotations: Option<Vec<String>>,
    /// Kubernetes: annotations naming a pod's project (default: none, the namespace).
    #[serde(default)]
    pub(super) k8s_project_annotations: Option<Vec<String>>,
    /// Kubernetes: extended resources that are GPUs (default `nvidia.com/gpu`, `amd.com/gpu`).
    #[serde(default)]
    pub(super) k8s_gpu_resources: Option<Vec<String>>,
    /// Kubernetes: CEEMS's `ns_users_list_file` (`users: {namespace: [user]}`), read at each
    /// pull; absent, none.
    #[serde(default)]
    pub(super) k8s_ns_users_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) sacct_path: Option<PathBuf>,
    /// Slurm: `NAME=value` variables its commands run with (`SLURM_CONF=/etc/slurm/b.conf`;
    /// CEEMS's `cli.environment_variables`).
    #[serde(default)]
    pub(super) slurm_env: Vec<String>,
    #[serde(default)]
    pub(super) sacctmgr_path: Option<String>,
    #[serde(default)]
    pub(super) slurm_cluster_name: Option<String>,
    #[serde(default)]
    pub(super) prometheus_url: Option<String>,
    /// CEEMS's updater queries (series → sub-key → template with `{{.UUIDs}}`): a cluster
    /// with them asks Prometheus only these (as CEEMS's `updaters` do).
    #[serde(default)]
    pub(super) series_queries:
        std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
    /// This cluster's slurmrestd, with `--slurm.source=slurmrestd`.
    #[serde(default, deserialize_with = "de_endpoint")]
    pub(super) slurmrestd_url: Option<rest::Endpoint>,
}

fn slurm_manager() -> String {
    crate::manager::slurm::MANAGER.to_owned()
}

fn de_endpoint<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<rest::Endpoint>, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map(Some).map_err(serde::de::Error::custom)
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
    #[serde(deserialize_with = "config::de_duration")]
    pub(super) scrape_interval: Duration,
    #[serde(deserialize_with = "config::de_duration")]
    pub(super) query_delay: Duration,
    #[serde(default)]
    pub(super) queries: Queries,
}

/// Where clusters are configured, one line per manager, for `--help`.
pub(super) const CLUSTERS_HELP: &str = "\
Clusters: without a config file, the --slurm.* flags describe one Slurm cluster. Several
clusters, or any that is not Slurm, go in the TOML file of --config.file: one
[[stats-server.clusters]] table each (examples/ceems.toml has them all), sharing one database.
One line each, as a `clusters = [ ... ]` array of the [stats-server] table:
  Slurm:      { id = \"hpc\", manager = \"slurm\", sacct-path = \"/usr/bin/sacct\" }
  LSF:        { id = \"lsf\", manager = \"lsf\", lsf-bin-dir = \"/opt/lsf/bin\", lsf-env = [\"LSF_ENVDIR=/opt/lsf/conf\"] }
  Kubernetes: { id = \"k8s\", manager = \"k8s\", kubeconfig = \"/etc/ceems/kubeconfig\" }
  OpenPBS:    { id = \"pbs\", manager = \"openpbs\", openpbs-accounting-dir = \"/var/spool/pbs/server_priv/accounting\" }
Any entry may set prometheus-url. `ceems check-privileges stats-server` tests what each needs.";

/// The Slurm clusters of the configuration: the `clusters` list, or the one of `--slurm.*`.
pub(super) fn clusters(
    settings: &Layered,
    slurm: &SlurmSettings,
) -> anyhow::Result<Vec<ClusterSettings>> {
    let list: Option<Vec<ClusterSettings>> = match settings.table.contains_key("clusters") {
        true => Some(settings.get("clusters")?),
        false => None,
    };
    let list = list.unwrap_or_else(|| {
        vec![ClusterSettings {
            id: slurm.cluster_id.clone(),
            manager: slurm_manager(),
            lsf_bin_dir: None,
            lsf_env: Vec::new(),
            openpbs_accounting_dir: None,
            openpbs_bin_dir: None,
            openpbs_env: Vec::new(),
            kubeconfig: None,
            k8s_user_annotations: None,
            k8s_project_annotations: None,
            k8s_gpu_resources: None,
            k8s_ns_users_file: None,
            sacct_path: None,
            slurm_env: Vec::new(),
            sacctmgr_path: None,
            slurm_cluster_name: None,
            prometheus_url: None,
            series_queries: Default::default(),
            slurmrestd_url: None,
        }]
    });
    let mut seen = std::collections::HashSet::new();
    for c in &list {
        anyhow::ensure!(!c.id.is_empty(), "clusters: an entry has an empty id");
        anyhow::ensure!(
            seen.insert(c.id.clone()),
            "clusters: id `{}` appears twice",
            c.id
        );
        let slurm_keys = c.sacct_path.is_some()
            || c.sacctmgr_path.is_some()
            || c.slurm_cluster_name.is_some()
            || c.slurmrestd_url.is_some()
            || !c.slurm_env.is_empty();
        let lsf_keys = c.lsf_bin_dir.is_some() || !c.lsf_env.is_empty();
        let pbs_keys = c.openpbs_accounting_dir.is_some()
            || c.openpbs_bin_dir.is_some()
            || !c.openpbs_env.is_empty();
        let k8s_keys = c.kubeconfig.is_some()
            || c.k8s_user_annotations.is_some()
            || c.k8s_project_annotations.is_some()
            || c.k8s_gpu_resources.is_some()
            || c.k8s_ns_users_file.is_some();
        match c.manager.as_str() {
            "slurm" => anyhow::ensure!(
                !lsf_keys && !k8s_keys && !pbs_keys,
                "clusters: `{}` is a Slurm cluster; lsf-* keys are for manager = \"lsf\", kubeconfig and k8s-* for manager = \"k8s\", openpbs-* for manager = \"openpbs\"",
                c.id
            ),
            "k8s" => anyhow::ensure!(
                !slurm_keys && !lsf_keys && !pbs_keys,
                "clusters: `{}` is a Kubernetes cluster; sacct-path, sacctmgr-path, slurm-cluster-name, slurmrestd-url, slurm-env, lsf-* and openpbs-* are not its keys",
                c.id
            ),
            "openpbs" => {
                anyhow::ensure!(
                    !slurm_keys && !lsf_keys && !k8s_keys,
                    "clusters: `{}` is an OpenPBS complex; only its openpbs-* keys and prometheus-url apply",
                    c.id
                );
                if let Some(bad) = c.openpbs_env.iter().find(|v| !v.contains('=')) {
                    anyhow::bail!("clusters: `{}`: openpbs-env `{bad}` is not NAME=value", c.id);
                }
            }
            "lsf" => {
                anyhow::ensure!(
                    !slurm_keys && !k8s_keys && !pbs_keys,
                    "clusters: `{}` is an LSF cluster; sacct-path, sacctmgr-path, slurm-cluster-name and slurmrestd-url are for Slurm",
                    c.id
                );
                if let Some(bad) = c.lsf_env.iter().find(|v| !v.contains('=')) {
                    anyhow::bail!("clusters: `{}`: lsf-env `{bad}` is not NAME=value", c.id);
                }
            }
            other => anyhow::bail!(
                "clusters: `{}`: manager `{other}` is not one the stats-server reads (slurm, lsf, k8s, openpbs)",
                c.id
            ),
        }
    }
    Ok(list)
}

/// Whether the stats-server keeps CAP_SETUID/CAP_SETGID: to run Slurm commands as a user.
pub fn needed_capabilities(settings: &Layered) -> anyhow::Result<Vec<caps::Capability>> {
    let user: String = settings.get("slurm.run-as-user")?;
    let source: String = settings.get("slurm.source")?;
    // slurmrestd does the switching itself: no command runs here.
    Ok(if user.is_empty() || source == "slurmrestd" {
        Vec::new()
    } else {
        runner::CAPABILITIES.to_vec()
    })
}

/// Decides how Slurm commands run, and logs the choice and why.
pub fn run_mode(run_as_user: &str, probe: &std::path::Path) -> RunMode {
    if run_as_user.is_empty() {
        tracing::info!("Slurm commands run as this process's user (--slurm.run-as-user is empty)");
        return RunMode::Native;
    }
    let facts = runner::Facts::of_process(run_as_user);
    let (mode, why) = runner::choose(&facts, |sudo| runner::sudo_allows(sudo, probe));
    tracing::info!(mode = %mode, reasons = %why.join("; "), "how sacct and sacctmgr run");
    mode
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
        let lines: Vec<&str> = CLUSTERS_HELP
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
        let slurm: SlurmSettings = settings.get("slurm").unwrap();
        let list = clusters(&settings, &slurm).unwrap_or_else(|e| panic!("{e:#}\n{text}"));
        let managers: Vec<&str> = list.iter().map(|c| c.manager.as_str()).collect();
        assert_eq!(
            managers,
            ["slurm", "lsf", "k8s", "openpbs"],
            "{CLUSTERS_HELP}"
        );
    }
}
