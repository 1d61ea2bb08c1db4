//! The stats-server's side of the managers, found by name: [`ACCOUNTINGS`] lists each
//! manager's [`AccountingSpec`], and each manager's folder turns one `clusters` entry into its
//! [`Accounting`]. The stats-server asks [`accounting_spec`] and knows no manager.

use std::sync::Arc;

use serde::de::DeserializeOwned;

use super::Accounting;
use crate::config::Layered;

/// How one manager's accounting is built from a cluster's entry.
pub struct AccountingSpec {
    /// The `manager` of an entry, as the schema records it.
    pub manager: &'static str,
    /// One entry of this manager, as `--help` shows it.
    pub example: &'static str,
    /// Checks the entry's keys and builds the accounting. Nothing is asked of the cluster yet:
    /// a manager that is down at start is retried by each pull.
    pub build: fn(&ClusterEntry<'_>) -> Result<Arc<dyn Accounting>, SetupError>,
}

/// Every manager whose units the stats-server pulls.
pub static ACCOUNTINGS: &[AccountingSpec] = &[
    super::slurm::setup::ACCOUNTING,
    super::lsf::setup::ACCOUNTING,
    super::k8s::setup::ACCOUNTING,
    super::openpbs::setup::ACCOUNTING,
    super::openstack::ACCOUNTING,
];

/// The spec of the manager named `manager`.
pub fn accounting_spec(manager: &str) -> Option<&'static AccountingSpec> {
    ACCOUNTINGS.iter().find(|s| s.manager == manager)
}

/// The managers' names, for messages.
pub fn manager_names() -> String {
    ACCOUNTINGS
        .iter()
        .map(|s| s.manager)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Keys of an entry that every manager shares; the subcommand reads them.
pub const SHARED_KEYS: &[&str] = &["id", "manager", "prometheus-url", "series-queries"];

/// One `clusters` entry, as its manager's builder reads it.
pub struct ClusterEntry<'a> {
    pub id: &'a str,
    /// The entry's keys but the shared ones.
    pub keys: toml::Table,
    /// Every setting of the subcommand: a Slurm cluster takes `--slurm.*` for what its entry
    /// does not say.
    pub settings: &'a Layered,
}

impl ClusterEntry<'_> {
    /// The entry's own keys as `T`; a key `T` does not know is an error naming it.
    pub fn parse<T: DeserializeOwned>(&self, manager: &str) -> Result<T, SetupError> {
        serde_path_to_error::deserialize(toml::Value::Table(self.keys.clone())).map_err(|e| {
            let key = e.path().to_string();
            let message = e.into_inner().to_string().trim().to_owned();
            // A key of another manager is named by the message itself.
            let whole = key == "." || message.starts_with("unknown field");
            self.error(match whole {
                true => format!("{message}, for manager = \"{manager}\""),
                false => format!("{key}: {message}"),
            })
        })
    }

    /// An error of this entry.
    pub fn error(&self, message: impl Into<String>) -> SetupError {
        SetupError {
            cluster: self.id.to_owned(),
            message: message.into(),
        }
    }
}

/// `NAME=value` items as pairs; the first that is not one, as an error.
pub fn name_values(items: &[String]) -> Result<Vec<(String, String)>, String> {
    items
        .iter()
        .map(|v| match v.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => Err(format!("`{v}` is not NAME=value")),
        })
        .collect()
}

/// A cluster entry that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
#[error("clusters: `{cluster}`: {message}")]
pub struct SetupError {
    pub cluster: String,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_manager_is_listed_once_and_found_by_its_name() {
        let mut names: Vec<&str> = ACCOUNTINGS.iter().map(|s| s.manager).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ACCOUNTINGS.len(), "{names:?}");
        for name in names {
            assert_eq!(accounting_spec(name).map(|s| s.manager), Some(name));
        }
        assert!(accounting_spec("pbspro").is_none());
    }
}
