//! The Grafana Alloy targets discoverer (CEEMS's `/alloy-targets`): one target per process of
//! each unit a manager's discovery finds (the registry picks the manager), for Alloy's Pyroscope
//! eBPF profiler. Optionally only the processes whose environment sets one of
//! `--discoverer.alloy-targets.env-var` (users opting in).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::units::ResourceManager;
use super::{Capability, CollectError};
use crate::config::{Kind, Layered, Opt};
use crate::host::processes;
use crate::host::procfs;

pub fn options() -> Vec<Opt> {
    vec![
        Opt::flag(
            "discoverer.alloy-targets",
            "Serve Grafana Alloy targets (one per job process) on --web.targets-path",
        )
        .key("discoverer.alloy-targets.enabled"),
        Opt::new(
            "discoverer.alloy-targets.resource-manager",
            Kind::Str,
            "Resource manager whose jobs are targets: slurm, lsf, k8s or openpbs (empty: the one whose collector is on; libvirt's VMs cannot be profiled from the host); naming it turns the discoverer on",
        )
        .possible(&["", "slurm", "lsf", "k8s", "openpbs"]),
        Opt::new(
            "discoverer.alloy-targets.env-var",
            Kind::List,
            "Only processes whose environment sets this variable (repeatable; any of them) are targets",
        ),
        Opt::new(
            "web.targets-path",
            Kind::Str,
            "Path under which Alloy targets are served",
        )
        .default("/alloy-targets"),
    ]
}

/// `[exporter.discoverer.alloy-targets]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AlloySettings {
    pub enabled: bool,
    /// Empty unless named: then the enabled manager's.
    #[serde(default)]
    pub resource_manager: String,
    #[serde(default)]
    pub env_var: Vec<String>,
}

impl AlloySettings {
    pub fn read(settings: &Layered) -> Result<AlloySettings, crate::config::ConfigError> {
        settings.get("discoverer.alloy-targets")
    }

    /// `--discoverer.alloy-targets`, or naming its resource manager (as CEEMS documents it).
    pub fn enabled(&self) -> bool {
        self.enabled || !self.resource_manager.is_empty()
    }
}

/// One Alloy target.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Target {
    pub targets: Vec<String>,
    pub labels: TargetLabels,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TargetLabels {
    #[serde(rename = "__process_pid__")]
    pub process_pid: String,
    pub service_name: String,
}

/// Whether the settings turn the discoverer on.
pub fn enabled(settings: &Layered) -> Result<bool, crate::config::ConfigError> {
    Ok(AlloySettings::read(settings)?.enabled())
}

pub struct AlloyTargets {
    /// Finds the units whose processes are targets.
    units: Box<dyn ResourceManager>,
    /// What reading other users' environments takes (the manager's collector's).
    capabilities: &'static [Capability],
    procfs: PathBuf,
    env_vars: Vec<String>,
}

impl AlloyTargets {
    pub fn new(
        units: Box<dyn ResourceManager>,
        capabilities: &'static [Capability],
        procfs: PathBuf,
        env_vars: Vec<String>,
    ) -> AlloyTargets {
        AlloyTargets {
            units,
            capabilities,
            procfs,
            env_vars,
        }
    }

    /// The current targets, by job then pid.
    pub fn targets(&self) -> Result<Vec<Target>, CollectError> {
        let mut faults = Vec::new();
        let jobs: Vec<(String, Vec<u32>)> = self
            .units
            .discover(&mut faults)?
            .into_iter()
            .map(|job| {
                let mut pids = processes::subtree_pids(&job.dir);
                pids.sort_unstable();
                pids.dedup();
                (job.uuid, pids)
            })
            .collect();
        let procfs = self.procfs.clone();
        let env_vars = self.env_vars.clone();
        // Reading other users' environ (the opt-in variables) needs the manager's capabilities.
        Ok(crate::security::privileged(self.capabilities, move || {
            let mut out = Vec::new();
            for (uuid, pids) in jobs {
                for pid in pids.into_iter().filter(|p| wanted(&procfs, &env_vars, *p)) {
                    out.push(Target {
                        targets: vec![uuid.clone()],
                        labels: TargetLabels {
                            process_pid: pid.to_string(),
                            service_name: uuid.clone(),
                        },
                    });
                }
            }
            out
        }))
    }
}

/// Whether process `pid` is still there and, when `env_vars` names some, sets one of them.
fn wanted(procfs: &Path, env_vars: &[String], pid: u32) -> bool {
    let dir = procfs.join(pid.to_string());
    if !dir.is_dir() {
        // Listed by the cgroup but already gone.
        return false;
    }
    if env_vars.is_empty() {
        return true;
    }
    let Ok(environ) = std::fs::read(dir.join("environ")) else {
        return false;
    };
    env_vars
        .iter()
        .any(|v| procfs::environ_var(&environ, v).is_some())
}
