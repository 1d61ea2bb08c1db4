//! The Grafana Alloy targets discoverer (CEEMS's `/alloy-targets`): one target per process of
//! each Slurm job, for Alloy's Pyroscope eBPF profiler. Optionally only the processes whose
//! environment sets one of `--discoverer.alloy-targets.env-var` (users opting in).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::units::{cgroup_version_of, ResourceManager};
use super::{CollectError, Paths};
use crate::config::{Kind, Layered, Opt};
use crate::host::processes;
use crate::host::procfs;
use crate::manager::slurm::SlurmManager;

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
            "Resource manager whose jobs are targets (only slurm: a VM's symbols cannot be resolved from the host); naming it turns the discoverer on",
        )
        .possible(&["", "slurm"]),
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Settings {
    enabled: bool,
    /// Empty unless named; Slurm is the only one.
    #[serde(default)]
    resource_manager: String,
    #[serde(default)]
    env_var: Vec<String>,
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

/// Whether the settings turn the discoverer on: `--discoverer.alloy-targets`, or naming its
/// resource manager.
pub fn enabled(settings: &Layered) -> Result<bool, crate::config::ConfigError> {
    let s: Settings = settings.get("discoverer.alloy-targets")?;
    Ok(s.enabled || !s.resource_manager.is_empty())
}

pub struct AlloyTargets {
    /// Finds the units whose processes are targets.
    units: Box<dyn ResourceManager>,
    procfs: PathBuf,
    env_vars: Vec<String>,
}

impl AlloyTargets {
    /// The discoverer asked for in the exporter's settings, if any.
    pub fn from_settings(settings: &Layered) -> Result<Option<AlloyTargets>, CollectError> {
        let err = |e: crate::config::ConfigError| CollectError::Other(e.to_string());
        let s: Settings = settings.get("discoverer.alloy-targets").map_err(err)?;
        // As CEEMS documents it, naming the resource manager is enough.
        if !enabled(settings).map_err(err)? {
            return Ok(None);
        }
        let paths: Paths = settings.get("path").map_err(err)?;
        let common = super::select(settings).map_err(err)?.common;
        let version = cgroup_version_of(common.cgroups.force_version.as_deref(), &paths.cgroupfs)?;
        let units = Box::new(SlurmManager::new(
            &paths.cgroupfs,
            &paths.procfs,
            version,
            &common.cgroups.active_subsystem,
        ));
        Ok(Some(AlloyTargets {
            units,
            procfs: paths.procfs,
            env_vars: s.env_var,
        }))
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
        // Reading other users' environ (the opt-in variables) needs the slurm collector's
        // capabilities.
        Ok(crate::security::privileged(
            crate::manager::slurm::SPEC.capabilities,
            move || {
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
            },
        ))
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
