//! What a Prometheus scrapes, turned into each scrape job's [`JobRules`]: its power source
//! (the first of Cray, Redfish, IPMI, RAPL), the GPU exporter scraping the same hosts, the
//! scrape interval, and whether the BMC's power counts the GPUs in.

use std::collections::BTreeMap;
use std::time::Duration;

use super::exprs::{GpuExporter, AMD_DEVICE_METRICS, AMD_SMI, DCGM};
use super::{Emissions, GpuRules, JobRules, PowerSource};
use crate::collect::MetricNames;
use crate::tool::{go_duration, Jobs, Prometheus, ToolError};

/// The series asked for: CEEMS's tool's list, with today's BMC names beside v0.10's (CEEMS's
/// tool knows only v0.10's, so today's exporters get no BMC rules from it).
const SERIES: [&str; 18] = [
    "ceems_compute_unit_cpu_user_seconds_total",
    "ceems_compute_unit_memory_used_bytes",
    "ceems_rapl_package_joules_total",
    "ceems_rapl_dram_joules_total",
    "ceems_ipmi_dcmi_current_watts",
    "ceems_ipmi_dcmi_power_current_watts",
    "ceems_redfish_current_watts",
    "ceems_redfish_power_current_watts",
    "ceems_cray_pm_counters_power_watts",
    "ceems_hwmon_power_current_watts",
    "ceems_emissions_gCo2_kWh",
    "DCGM_FI_DEV_POWER_USAGE_INSTANT",
    "amd_gpu_power",
    "gpu_power_usage",
    "amd_gpu_package_power",
    "gpu_package_power",
    "ceems_compute_unit_gpu_index_flag",
    "ceems_compute_unit_gpu_sm_count",
];

/// DCGM's profiling series, in the order their rules are written.
pub const PROFILING: [&str; 12] = [
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
];

/// The operator's choices.
#[derive(Debug, Clone)]
pub struct Settings {
    pub pue: f64,
    /// A static factor (g/kWh) instead of the factor series; 0: none.
    pub emission_factor: f64,
    pub country: String,
    /// The per-unit groups' interval; None: Prometheus's evaluation interval.
    pub eval: Option<Duration>,
    /// Ignore the factor series (CEEMS's e2e switch).
    pub disable_providers: bool,
    /// OWID's factor for `country`, used when no factor series is found.
    pub owid_factor: Option<f64>,
    /// Which CEEMS generation's rules are written.
    pub generation: MetricNames,
}

/// Picks, for a scrape job, the Redfish chassis that reports its nodes' power.
pub type ChooseChassis = dyn FnMut(&str, &[String]) -> Result<String, ToolError>;

/// What was found: the emission factor, each scrape job's rules, and notes for the operator.
#[derive(Debug)]
pub struct Discovery {
    pub emissions: Emissions,
    pub jobs: Vec<JobRules>,
    pub notes: Vec<String>,
}

/// Asks `prometheus` what it scrapes in `window`; `choose_chassis` picks a Redfish chassis
/// when a job's BMCs report several.
pub fn discover(
    prometheus: &Prometheus,
    window: (f64, f64),
    settings: &Settings,
    choose_chassis: &mut ChooseChassis,
) -> Result<Discovery, ToolError> {
    let (scrape_interval, evaluation_interval) = intervals(prometheus)?;
    let job_intervals = job_scrape_intervals(prometheus)?;
    let mut notes = Vec::new();
    let emissions = emissions(prometheus, window, settings, &mut notes);
    let amd_profiling = amd_profiling_series();
    let names: Vec<&str> = SERIES
        .iter()
        .chain(PROFILING.iter())
        .copied()
        .chain(amd_profiling.iter().map(String::as_str))
        .collect();
    let series = prometheus.series(&names, window)?;
    let jobs = Jobs::of(&series);
    let gpu_jobs = gpu_jobs(&jobs, &series);
    // Today's rules read hwmon's socket power where a job's nodes have it.
    let hwmon_jobs: Vec<String> = match settings.generation {
        MetricNames::V010 => Vec::new(),
        MetricNames::Current => prometheus
            .series(
                &["ceems_hwmon_power_current_watts{chip=\"socket\"}"],
                window,
            )?
            .into_iter()
            .filter_map(|s| s.get("job").cloned())
            .collect(),
    };
    let eval = go_duration(settings.eval.unwrap_or(evaluation_interval));
    let mut found = Vec::new();
    for job in &jobs.order {
        let has = |name: &str| jobs.has(job, name);
        let first = |names: [&'static str; 2]| names.into_iter().find(|n| has(n));
        let source = if has("ceems_cray_pm_counters_power_watts") {
            PowerSource::Cray
        } else if let Some(series) = first([
            "ceems_redfish_current_watts",
            "ceems_redfish_power_current_watts",
        ]) {
            let chassis = chassis(prometheus, window, job, series, choose_chassis)?;
            PowerSource::Bmc {
                series: series.to_owned(),
                chassis: Some(chassis),
            }
        } else if let Some(series) = first([
            "ceems_ipmi_dcmi_current_watts",
            "ceems_ipmi_dcmi_power_current_watts",
        ]) {
            PowerSource::Bmc {
                series: series.to_owned(),
                chassis: None,
            }
        } else if hwmon_jobs.contains(job) {
            PowerSource::Hwmon
        } else if has("ceems_rapl_package_joules_total") {
            PowerSource::Rapl
        } else {
            continue;
        };
        let scrape = job_intervals.get(job).copied().unwrap_or(scrape_interval);
        let mut rules = JobRules {
            job: job.clone(),
            rapl: has("ceems_rapl_package_joules_total") && has("ceems_rapl_dram_joules_total"),
            gpu: None,
            rate: go_duration(scrape * 4),
            eval: eval.clone(),
            pue: settings.pue,
            source,
            generation: settings.generation,
        };
        if let Some(gpu_job) = gpu_jobs.get(job) {
            let mut gpu = gpu_rules(&jobs, gpu_job);
            // An APU's socket power counts its GPU in.
            gpu.power_in_host = rules.source == PowerSource::Hwmon;
            if let PowerSource::Bmc { .. } = rules.source {
                match gpus_counted_in(prometheus, window, &rules, &gpu) {
                    Ok(counted) => gpu.power_in_host = counted,
                    Err(e) => notes.push(format!(
                        "failed to verify if host power of job {job} includes GPU power; check by hand and edit the rule: {e}"
                    )),
                }
            }
            rules.gpu = Some(gpu);
        }
        found.push(rules);
    }
    Ok(Discovery {
        emissions,
        jobs: found,
        notes,
    })
}

/// Prometheus's global scrape and evaluation intervals.
fn intervals(prometheus: &Prometheus) -> Result<(Duration, Duration), ToolError> {
    #[derive(serde::Deserialize, Default)]
    struct Global {
        scrape_interval: Option<String>,
        evaluation_interval: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Config {
        #[serde(default)]
        global: Global,
    }
    let data = prometheus.get("/api/v1/status/config", &[])?;
    let yaml = data["yaml"].as_str().unwrap_or_default();
    let config: Config = serde_norway::from_str(yaml).map_err(|e| ToolError::Request {
        url: "/api/v1/status/config".into(),
        reason: format!("its config does not parse: {e}"),
    })?;
    let minute = Duration::from_secs(60);
    let parse = |d: Option<String>| {
        d.and_then(|d| humantime::parse_duration(&d).ok())
            .unwrap_or(minute)
    };
    Ok((
        parse(config.global.scrape_interval),
        parse(config.global.evaluation_interval),
    ))
}

/// Each scrape job's interval, from its active targets.
fn job_scrape_intervals(prometheus: &Prometheus) -> Result<BTreeMap<String, Duration>, ToolError> {
    let data = prometheus.get("/api/v1/targets", &[("state", "active".into())])?;
    let mut intervals = BTreeMap::new();
    for target in data["activeTargets"].as_array().into_iter().flatten() {
        let labels = &target["discoveredLabels"];
        let interval = labels["__scrape_interval__"]
            .as_str()
            .and_then(|d| humantime::parse_duration(d).ok());
        if let (Some(job), Some(interval)) = (labels["job"].as_str(), interval) {
            intervals.insert(job.to_owned(), interval);
        }
    }
    Ok(intervals)
}

/// The factor series' providers for the country, else the static factor asked for or OWID's.
fn emissions(
    prometheus: &Prometheus,
    window: (f64, f64),
    settings: &Settings,
    notes: &mut Vec<String>,
) -> Emissions {
    let country = settings.country.clone();
    if settings.emission_factor != 0.0 {
        return Emissions::Static {
            provider: "custom".into(),
            factor: settings.emission_factor,
            country,
        };
    }
    let matcher = format!(
        "ceems_emissions_gCo2_kWh{{country_code=\"{}\"}}",
        super::promql_string(&country)
    );
    let providers = prometheus
        .label_values("provider", &[&matcher], window)
        .unwrap_or_default();
    if !providers.is_empty() && !settings.disable_providers {
        // Today's CEEMS reads one emissions target's factors, so that several targets (a
        // node's exporter and a dedicated one) do not give each unit several series.
        let instance = match settings.generation {
            MetricNames::V010 => None,
            MetricNames::Current => prometheus
                .label_values("instance", &[&matcher], window)
                .unwrap_or_default()
                .into_iter()
                .min(),
        };
        if let Some(i) = &instance {
            notes.push(format!("emission factors of target {i} will be used"));
        }
        return Emissions::Providers {
            providers,
            country,
            instance,
        };
    }
    match settings.owid_factor {
        Some(factor) if factor > 0.0 => {
            notes.push(format!(
                "static emission factor {factor} g/kWh from OWID data will be used"
            ));
            Emissions::Static {
                provider: "owid".into(),
                factor,
                country,
            }
        }
        _ => {
            notes.push(format!(
                "no emission factor series for country code {country:?} and no static factor (--country-code, --emission-factor): no emission rules"
            ));
            Emissions::None
        }
    }
}

/// For each scrape job with GPU index flags, the GPU exporter's job that scrapes one of its
/// hosts (DCGM, then AMD SMI, then AMD device metrics: the last found is kept, as CEEMS's
/// tool keeps it).
fn gpu_jobs(jobs: &Jobs, series: &[BTreeMap<String, String>]) -> BTreeMap<String, String> {
    // Jobs of each series name, in the order their series came.
    let mut by_name: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for s in series {
        let (Some(name), Some(job)) = (s.get("__name__"), s.get("job")) else {
            continue;
        };
        let list = by_name.entry(name).or_default();
        if !list.contains(&job.as_str()) {
            list.push(job);
        }
    }
    let hosts = |job: &str| jobs.hosts.get(job).cloned().unwrap_or_default();
    let mut map = BTreeMap::new();
    for cpu_job in by_name
        .get("ceems_compute_unit_gpu_index_flag")
        .into_iter()
        .flatten()
    {
        let cpu_hosts = hosts(cpu_job);
        for exporter in [&DCGM, &AMD_SMI, &AMD_DEVICE_METRICS] {
            for name in power_names(exporter) {
                for gpu_job in by_name.get(name).into_iter().flatten() {
                    if hosts(gpu_job).iter().any(|h| cpu_hosts.contains(h)) {
                        map.insert(cpu_job.to_string(), gpu_job.to_string());
                    }
                }
            }
        }
    }
    map
}

fn gpu_rules(jobs: &Jobs, gpu_job: &str) -> GpuRules {
    let device_metrics = power_names(&AMD_DEVICE_METRICS)
        .iter()
        .any(|n| jobs.has(gpu_job, n));
    let exporter: &'static GpuExporter = if jobs.has(gpu_job, DCGM.power_series) {
        &DCGM
    } else if device_metrics {
        &AMD_DEVICE_METRICS
    } else {
        &AMD_SMI
    };
    // AMD's device metrics exporter of today names its series `amd_gpu_*`.
    let metric_prefix = match jobs.has(gpu_job, "amd_gpu_package_power") {
        true => "amd_",
        false => "",
    };
    let profiling = if exporter.power_series == DCGM.power_series {
        PROFILING
            .iter()
            .filter(|p| jobs.has(gpu_job, p))
            .map(|p| p.to_string())
            .collect()
    } else if device_metrics {
        AMD_PROFILING
            .iter()
            .map(|p| format!("{metric_prefix}gpu_{p}"))
            .filter(|p| jobs.has(gpu_job, p))
            .collect()
    } else {
        Vec::new()
    };
    GpuRules {
        exporter,
        job: gpu_job.to_owned(),
        power_in_host: false,
        profiling,
        metric_prefix,
    }
}

/// The power series a GPU exporter is known by: AMD's device metrics exporter has had three
/// names for it (v0.10's, today's, and today's without the `amd_` prefix).
fn power_names(exporter: &'static GpuExporter) -> &'static [&'static str] {
    const DEVICE_METRICS: [&str; 3] = [
        AMD_DEVICE_METRICS.power_series,
        "amd_gpu_package_power",
        "gpu_package_power",
    ];
    match exporter.power_series == AMD_DEVICE_METRICS.power_series {
        true => &DEVICE_METRICS,
        false => std::slice::from_ref(&exporter.power_series),
    }
}

/// AMD's device metrics profiling series (after `amd_gpu_` or `gpu_`), in the order CEEMS
/// writes their rules.
pub const AMD_PROFILING: [&str; 8] = [
    "prof_sm_active",
    "prof_tensor_active_percent",
    "prof_occupancy_percent",
    "prof_total_16_ops",
    "prof_total_32_ops",
    "prof_total_64_ops",
    "prof_write_size",
    "prof_fetch_size",
];

/// Every name of AMD's profiling series, with and without the `amd_` prefix.
fn amd_profiling_series() -> Vec<String> {
    ["amd_", ""]
        .iter()
        .flat_map(|prefix| {
            AMD_PROFILING
                .iter()
                .map(move |p| format!("{prefix}gpu_{p}"))
        })
        .collect()
}

/// The Redfish chassis that reports the node's power: the only one, or the operator's pick.
fn chassis(
    prometheus: &Prometheus,
    window: (f64, f64),
    job: &str,
    series: &str,
    choose: &mut ChooseChassis,
) -> Result<String, ToolError> {
    let matcher = format!("{series}{{job=\"{}\"}}", super::promql_string(job));
    let chassis = prometheus.label_values("chassis", &[&matcher], window)?;
    match chassis.as_slice() {
        [] => Err(ToolError::Request {
            url: prometheus.url().to_owned(),
            reason: format!("no chassis found for {series} of job {job}"),
        }),
        [one] => Ok(one.clone()),
        many => choose(job, many),
    }
}

/// Whether the BMC's power less the GPUs' stays above zero over the window (so it counts them).
fn gpus_counted_in(
    prometheus: &Prometheus,
    (start, end): (f64, f64),
    rules: &JobRules,
    gpu: &GpuRules,
) -> Result<bool, ToolError> {
    let PowerSource::Bmc { series, chassis } = &rules.source else {
        return Ok(false);
    };
    let chassis = chassis.as_deref().map_or(String::new(), |c| {
        format!(",chassis=\"{}\"", super::promql_string(c))
    });
    let difference = super::fill(
        &super::exprs::bmc_power_less_gpus(gpu.exporter.power_series, gpu.exporter.power_scaler),
        &[
            ("S", series),
            ("J", &super::promql_string(&rules.job)),
            ("CL", &chassis),
            ("G", &super::promql_string(&gpu.job)),
        ],
    );
    let span = Duration::from_secs((((end - start).max(0.0) as u64) / 60) * 60);
    let query = format!("avg_over_time({difference}[{}:])", go_duration(span));
    let data = prometheus.get(
        "/api/v1/query",
        &[("query", query), ("time", end.to_string())],
    )?;
    let first = data["result"][0]["value"][1]
        .as_str()
        .and_then(|v| v.parse::<f64>().ok());
    Ok(first.is_some_and(|v| v > 0.0))
}
