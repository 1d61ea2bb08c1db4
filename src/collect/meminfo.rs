//! `meminfo`: host memory from /proc/meminfo.

use std::path::PathBuf;

use serde::Deserialize;

use super::{CollectError, Collector, CollectorSpec, Context};
use crate::config::Opt;
use crate::host::procfs;
use crate::metrics::{Labels, MetricSet};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "meminfo",
    default_enabled: true,
    capabilities: &[],
    options,
    build,
    self_test: None,
    sub_collectors: &[],
};

/// The fields CEEMS exports unless `--collector.meminfo.all-stats` is given.
const DEFAULT_FIELDS: &[&str] = &["MemTotal_bytes", "MemFree_bytes", "MemAvailable_bytes"];

fn options() -> Vec<Opt> {
    vec![Opt::flag(
        "collector.meminfo.all-stats",
        "Export every field of /proc/meminfo, not only MemTotal, MemFree and MemAvailable",
    )]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Settings {
    all_stats: bool,
}

pub struct MeminfoCollector {
    path: PathBuf,
    labels: Labels,
    all_stats: bool,
}

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    let s: Settings = ctx.settings()?;
    Ok(Box::new(MeminfoCollector {
        path: ctx.paths.procfs.join("meminfo"),
        labels: ctx.hostname_labels(),
        all_stats: s.all_stats,
    }))
}

impl Collector for MeminfoCollector {
    fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
        let text =
            std::fs::read_to_string(&self.path).map_err(|e| CollectError::io(&self.path, e))?;
        let mut found = [false; DEFAULT_FIELDS.len()];
        procfs::meminfo(&text, |name, value| {
            let wanted = match DEFAULT_FIELDS.iter().position(|f| *f == name) {
                Some(i) => {
                    found[i] = true;
                    true
                }
                None => self.all_stats,
            };
            if wanted {
                emit(out, &self.labels, &name, value);
            }
        })
        .map_err(|source| CollectError::Parse {
            path: self.path.clone(),
            source,
        })?;
        // Old kernels lack MemAvailable; CEEMS reports such fields as 0.
        for (field, seen) in DEFAULT_FIELDS.iter().zip(found) {
            if !seen {
                emit(out, &self.labels, field, 0.0);
            }
        }
        Ok(())
    }
}

fn emit(out: &mut MetricSet, labels: &Labels, field: &str, value: f64) {
    out.gauge(
        &format!("ceems_meminfo_{field}"),
        &format!("Memory information field {field}."),
        labels.clone(),
        value,
    );
}
