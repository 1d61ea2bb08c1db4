//! `tsdb create-recording-rules`: for each scrape job of ceems exporters, the recording rules
//! that fit its nodes' power source (HPE Cray counters, a BMC through IPMI DCMI or Redfish, or
//! RAPL) and GPUs (NVIDIA's DCGM exporter, AMD's SMI or device metrics exporter), recording the
//! names CEEMS's `ceems_tool` records. [`discover`] asks Prometheus what each job has;
//! [`host_rules`] and [`gpu_rules`] write the files.

pub mod discover;
pub mod exprs;
mod today;

use crate::collect::MetricNames;
use exprs::GpuExporter;

/// Where a scrape job's node power comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum PowerSource {
    /// `ceems_cray_pm_counters_power_watts`, by domain.
    Cray,
    /// A BMC's node power series (IPMI DCMI or Redfish, either generation's name), and for
    /// Redfish the chassis that reports the node.
    Bmc {
        series: String,
        chassis: Option<String>,
    },
    /// RAPL counters only (packages and DRAM).
    Rapl,
    /// hwmon's socket power (today's rules: AMD's APUs, whose socket power counts the GPU in).
    Hwmon,
}

/// The GPUs of a scrape job's nodes, as another scrape job exports them.
#[derive(Debug, Clone)]
pub struct GpuRules {
    pub exporter: &'static GpuExporter,
    /// The GPU exporter's scrape job.
    pub job: String,
    /// The BMC's node power counts the GPUs in (seen in the data): the rules take them out.
    pub power_in_host: bool,
    /// The profiling series the exporter has (DCGM's, AMD device metrics'), in CEEMS's order.
    pub profiling: Vec<String>,
    /// AMD device metrics: `amd_` when it names its series `amd_gpu_*`, else empty.
    pub metric_prefix: &'static str,
}

/// The emission factor the rules multiply power by.
#[derive(Debug, Clone, PartialEq)]
pub enum Emissions {
    None,
    /// The factor series of these providers for `country`, from one target's `instance`
    /// (today's CEEMS) or from every target (v0.10).
    Providers {
        providers: Vec<String>,
        country: String,
        instance: Option<String>,
    },
    /// A fixed factor (g/kWh) under a provider's name.
    Static {
        provider: String,
        factor: f64,
        country: String,
    },
}

/// What one scrape job's rules are made of.
#[derive(Debug, Clone)]
pub struct JobRules {
    pub job: String,
    pub source: PowerSource,
    /// The nodes have RAPL package and DRAM counters (splits a BMC's power between them).
    pub rapl: bool,
    pub gpu: Option<GpuRules>,
    /// Rate window (four scrape intervals), in Go's duration spelling.
    pub rate: String,
    /// Evaluation interval of the per-unit groups.
    pub eval: String,
    pub pue: f64,
    /// Which CEEMS generation's rules: today's add the IO and network groups.
    pub generation: MetricNames,
}

/// `text` as a PromQL string's inside.
fn promql_string(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}

/// `template` with each `%NAME%` of `values` replaced, in one pass (values are not re-read).
fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len() + 64);
    let mut rest = template;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let hit = values
            .iter()
            .find(|(name, _)| after.starts_with(name) && after[name.len()..].starts_with('%'));
        match hit {
            Some((name, value)) => {
                out.push_str(value);
                rest = &after[name.len() + 1..];
            }
            None => {
                out.push('%');
                rest = after;
            }
        }
    }
    out + rest
}

struct Rule {
    comment: &'static str,
    record: String,
    /// Labels the rule adds (AMD's memory `type`).
    labels: Vec<(&'static str, &'static str)>,
    expr: String,
}

impl Rule {
    fn filled(comment: &'static str, record: &str, expr: &str, values: &[(&str, &str)]) -> Rule {
        Rule {
            comment,
            record: record.to_owned(),
            labels: Vec::new(),
            expr: fill(expr, values),
        }
    }
}

struct Group {
    name: String,
    interval: String,
    rules: Vec<Rule>,
}

/// A YAML scalar: plain when it reads back as the same string, else double-quoted.
fn scalar(text: &str) -> String {
    let plain = !text.is_empty()
        && !text.contains(": ")
        && !text.contains(" #")
        && !text.ends_with([':', ' '])
        && !text.starts_with(|c: char| c.is_whitespace() || "-?:,[]{}#&*!|>'\"%@`".contains(c))
        && !text.contains('\n');
    match plain {
        true => text.to_owned(),
        false => serde_json::Value::from(text).to_string(),
    }
}

/// A file's two groups: the units' rules at the evaluation interval, the nodes' at the rate
/// window, each named after `job`.
fn two_groups(
    r: &JobRules,
    (units_name, units): (&str, Vec<Rule>),
    (nodes_name, nodes): (&str, Vec<Rule>),
    job: &str,
) -> [Group; 2] {
    [
        Group {
            name: format!("{units_name}-{job}"),
            interval: r.eval.clone(),
            rules: units,
        },
        Group {
            name: format!("{nodes_name}-{job}"),
            interval: r.rate.clone(),
            rules: nodes,
        },
    ]
}

/// The rules file: a header comment, then the groups.
fn yaml(header: &str, groups: &[Group]) -> String {
    let mut out = String::new();
    for line in header.lines() {
        out += &format!("# {line}\n").replace("# \n", "#\n");
    }
    out += "groups:\n";
    for (i, g) in groups.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out += &format!(
            "  - name: {}\n    interval: {}\n    rules:\n",
            scalar(&g.name),
            scalar(&g.interval)
        );
        for (i, r) in g.rules.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            if !r.comment.is_empty() {
                out += &format!("      # {}\n", r.comment);
            }
            out += &format!("      - record: {}\n", scalar(&r.record));
            if !r.labels.is_empty() {
                out += "        labels:\n";
                for (k, v) in &r.labels {
                    out += &format!("          {k}: {}\n", scalar(v));
                }
            }
            if r.expr.contains('\n') || scalar(&r.expr) != r.expr {
                out += "        expr: |\n";
                for line in r.expr.lines() {
                    out += &format!("          {line}\n");
                }
            } else {
                out += &format!("        expr: {}\n", r.expr);
            }
        }
    }
    out
}

/// The placeholders of `exprs` for a job.
fn values<'a>(r: &'a JobRules, escaped: &'a [String; 3], pue: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("J", escaped[0].as_str()),
        ("G", escaped[1].as_str()),
        ("CL", escaped[2].as_str()),
        ("R", r.rate.as_str()),
        ("P", pue),
    ]
}

/// The emission rules of `record` for `energy_rate`, one per provider (or one with the
/// static factor, or none).
fn emission_rules(
    e: &Emissions,
    record: &str,
    comment: &'static str,
    by_provider: &str,
    fixed: &str,
) -> Vec<Rule> {
    match e {
        Emissions::None => Vec::new(),
        Emissions::Providers {
            providers,
            country,
            instance,
        } => providers
            .iter()
            .map(|p| Rule {
                comment,
                record: record.into(),
                labels: Vec::new(),
                expr: fill(
                    by_provider,
                    &[
                        ("V", &promql_string(p)),
                        ("CC", &promql_string(country)),
                        ("EI", &instance_matcher(instance.as_deref(), true)),
                    ],
                ),
            })
            .collect(),
        Emissions::Static {
            provider,
            factor,
            country,
        } => vec![Rule {
            comment,
            record: record.into(),
            labels: Vec::new(),
            expr: fill(
                fixed,
                &[
                    ("V", &promql_string(provider)),
                    ("CC", &promql_string(country)),
                    ("F", &factor.to_string()),
                ],
            ),
        }],
    }
}

/// `,instance="..."` (after other matchers) or `{instance="..."}` (alone), or nothing.
fn instance_matcher(instance: Option<&str>, after_others: bool) -> String {
    match (instance, after_others) {
        (None, _) => String::new(),
        (Some(i), true) => format!(",instance=\"{}\"", promql_string(i)),
        (Some(i), false) => format!("{{instance=\"{}\"}}", promql_string(i)),
    }
}

fn job_emission_rules(e: &Emissions, what: &str) -> Vec<Rule> {
    let record = format!("job:ceems_{what}_emissions_g_s:pue");
    match e {
        // The factor series carry the country and provider labels themselves.
        Emissions::Providers { instance, .. } => vec![Rule {
            comment: "Emissions (g/s) of the scrape job's power, by provider",
            record,
            labels: Vec::new(),
            expr: fill(
                &exprs::job_emissions_by_provider(what),
                &[("EI", &instance_matcher(instance.as_deref(), false))],
            ),
        }],
        _ => emission_rules(
            e,
            &record,
            "Emissions (g/s) of the scrape job's power, with the static factor",
            "",
            &exprs::job_emissions_static(what),
        ),
    }
}

/// `instance:SERIES:pue` and its expression.
fn pue_times(series: &str) -> (String, String) {
    (
        format!("instance:{series}:pue"),
        format!("%P% * {series}{{job=\"%J%\"}}"),
    )
}

/// The node rules of a scrape job (`JOB.rules`).
pub fn host_rules(r: &JobRules, e: &Emissions) -> String {
    let pue = r.pue.to_string();
    let chassis = match &r.source {
        PowerSource::Bmc {
            chassis: Some(c), ..
        } => format!(",chassis=\"{}\"", promql_string(c)),
        _ => String::new(),
    };
    let gpu_job = r.gpu.as_ref().map_or("", |g| g.job.as_str());
    let escaped = [promql_string(&r.job), promql_string(gpu_job), chassis];
    let mut v = values(r, &escaped, &pue);
    let series = match &r.source {
        PowerSource::Bmc { series, .. } => series.clone(),
        PowerSource::Cray => "ceems_cray_pm_counters_power_watts".into(),
        PowerSource::Rapl => String::new(),
        PowerSource::Hwmon => exprs::HWMON_SERIES.into(),
    };
    v.push(("S", &series));
    let rule = |comment, record: &str, expr: &str| Rule::filled(comment, record, expr, &v);
    let mut units = vec![
        rule(
            "CPU use (%) of each unit relative to its CPUs",
            "uuid:ceems_cpu_usage:ratio_irate",
            exprs::CPU_USAGE,
        ),
        rule(
            "Memory use (%) of each unit relative to its limit",
            "uuid:ceems_cpu_memory_usage:ratio",
            exprs::MEMORY_USAGE,
        ),
    ];
    // The node power series with the PUE, the unit's share of it, the nodes' power.
    let (header, source_rules, unit_power, nodes_power): (_, Vec<(String, String)>, _, _) =
        match &r.source {
            PowerSource::Cray => (
                "Node power: HPE Cray pm_counters, by domain (CPU, memory, the rest).",
                vec![pue_times("ceems_cray_pm_counters_power_watts")],
                exprs::cray_job_power(),
                exprs::CRAY_NODES_POWER.to_owned(),
            ),
            PowerSource::Rapl => (
                "Node power: RAPL packages and DRAM (a lower bound of the node's).",
                vec![
                    pue_times("ceems_rapl_package_joules_total"),
                    pue_times("ceems_rapl_dram_joules_total"),
                ],
                exprs::rapl_job_power(),
                exprs::RAPL_NODES_POWER.to_owned(),
            ),
            PowerSource::Bmc { .. } | PowerSource::Hwmon => {
                let read = match r.source {
                    PowerSource::Hwmon => exprs::HWMON_POWER,
                    _ => exprs::BMC_POWER,
                };
                let today = r.generation == MetricNames::Current;
                let node = match &r.gpu {
                    Some(g) if g.power_in_host => {
                        match exprs::node_power_less_gpus(read, g).filter(|_| today) {
                            Some(less) => less,
                            None => format!(
                                "{} > 0",
                                exprs::bmc_power_less_gpus(
                                    g.exporter.power_series,
                                    g.exporter.power_scaler
                                )
                            ),
                        }
                    }
                    _ => read.to_owned(),
                };
                (
                    "Node power: the BMC's (less the GPUs' where it counts them in).",
                    vec![(format!("instance:{series}:pue"), format!("%P% * {node}"))],
                    exprs::bmc_job_power(r.rapl),
                    format!("sum by (job) (%P% * {node})"),
                )
            }
        };
    for (record, expr) in &source_rules {
        units.push(rule(
            "Node power with the facility's overhead (PUE)",
            record,
            expr,
        ));
    }
    units.push(rule(
        "Each unit's part of its node's power (W), PUE included",
        "uuid:ceems_host_power_watts:pue",
        &unit_power,
    ));
    let unit_energy = fill("uuid:ceems_host_power_watts:pue{job=\"%J%\"} / 3.6e+06", &v);
    units.extend(emission_rules(
        e,
        "uuid:ceems_host_emissions_g_s:pue",
        "Each unit's emissions (g/s) from its power",
        &exprs::emissions_by_provider(&unit_energy, false),
        &exprs::emissions_static(&unit_energy),
    ));
    let mut nodes = vec![
        rule(
            "Average CPU use (%) of the scrape job's nodes",
            "job:ceems_cpu_usage:avg_ratio_irate",
            exprs::NODES_CPU_USAGE,
        ),
        rule(
            "Average memory use (%) of the scrape job's nodes",
            "job:ceems_cpu_memory_usage:avg_ratio",
            exprs::NODES_MEMORY_USAGE,
        ),
        rule(
            "Power (W) of the scrape job's nodes without GPUs, PUE included",
            "job:ceems_host_power_watts:pue",
            &nodes_power,
        ),
    ];
    for mut rule in job_emission_rules(e, "host") {
        rule.expr = fill(&rule.expr, &v);
        nodes.push(rule);
    }
    let header = format!(
        "Recording rules for the compute units of scrape job {}, written by\n`ceems tool tsdb create-recording-rules`. Review them: the splits are estimates.\n{header}",
        r.job
    );
    let mut groups = Vec::from(two_groups(
        r,
        ("compute-unit-rules", units),
        ("host-agg-rules", nodes),
        &r.job,
    ));
    if r.generation == MetricNames::Current {
        groups.extend(today::io_and_network_groups(r, &v));
    }
    yaml(&header, &groups)
}

/// The GPU rules of a scrape job's GPUs (`GPUJOB-gpu.rules`).
pub fn gpu_rules(r: &JobRules, gpu: &GpuRules, e: &Emissions) -> String {
    if r.generation == MetricNames::Current {
        return today::gpu_rules(r, gpu, e);
    }
    let pue = r.pue.to_string();
    let escaped = [
        promql_string(&r.job),
        promql_string(&gpu.job),
        String::new(),
    ];
    let mut v = values(r, &escaped, &pue);
    let has = |s: &str| gpu.profiling.iter().any(|p| p == s);
    let usage_series = match has("DCGM_FI_PROF_GR_ENGINE_ACTIVE") {
        true => "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        false => "DCGM_FI_DEV_GPU_UTIL",
    };
    v.push(("U", usage_series));
    let x = gpu.exporter;
    let rule = |comment, record: &str, expr: &str| Rule::filled(comment, record, expr, &v);
    let mut units = vec![
        rule(
            "GPU use (%) of each unit's GPUs",
            "uuid:ceems_gpu_usage:ratio",
            &exprs::per_unit(x, x.usage),
        ),
        rule(
            "GPU memory use (%) of each unit's GPUs",
            "uuid:ceems_gpu_memory_usage:ratio",
            &exprs::per_unit(x, x.memory_usage),
        ),
        rule(
            "Each GPU's power (W), PUE included",
            x.device_power_record,
            x.device_power,
        ),
        rule(
            "Each unit's GPU power (W), by its share of the GPU's SMs",
            "uuid:ceems_gpu_power_watts:pue",
            &exprs::gpu_unit_power(
                x,
                has("DCGM_FI_PROF_SM_ACTIVE") && has("DCGM_FI_PROF_SM_OCCUPANCY"),
            ),
        ),
    ];
    let unit_energy = fill(
        &exprs::per_unit(
            x,
            &format!("{}{{job=\"%G%\"}} / 3.6e+06", x.device_power_record),
        ),
        &v,
    );
    units.extend(emission_rules(
        e,
        "uuid:ceems_gpu_emissions_g_s:pue",
        "Each unit's emissions (g/s) from its GPUs' power",
        &exprs::emissions_by_provider(&unit_energy, true),
        &exprs::emissions_static(&unit_energy),
    ));
    for p in &gpu.profiling {
        let name = p.trim_start_matches("DCGM_FI_PROF_").to_lowercase();
        units.push(rule(
            "A DCGM profiling ratio (%) of each unit's GPUs",
            &format!("uuid:ceems_gpu_{name}:ratio"),
            &exprs::per_unit(x, &format!("{p}{{job=\"%G%\"}} * 100")),
        ));
    }
    let nodes = vec![
        rule(
            "Average GPU use (%) of the scrape job's GPUs",
            "job:ceems_gpu_usage:avg",
            x.jobs_usage,
        ),
        rule(
            "Average GPU memory use (%) of the scrape job's GPUs",
            "job:ceems_gpu_memory_usage:avg_ratio",
            x.jobs_memory_usage,
        ),
        rule(
            "Power (W) of the scrape job's GPUs, PUE included",
            "job:ceems_gpu_power_watts:pue",
            x.jobs_power,
        ),
    ];
    gpu_file(r, gpu, e, (units, nodes), &v, "")
}

/// A GPU rules file from its unit and node rules: the scrape job's emission rules added (its
/// series are the GPU exporter's job's), then the header and the two groups.
fn gpu_file(
    r: &JobRules,
    gpu: &GpuRules,
    e: &Emissions,
    (units, mut nodes): (Vec<Rule>, Vec<Rule>),
    v: &[(&str, &str)],
    note: &str,
) -> String {
    let gpu_job = promql_string(&gpu.job);
    let mut v = v.to_vec();
    v[0].1 = &gpu_job;
    for mut rule in job_emission_rules(e, "gpu") {
        rule.expr = fill(&rule.expr, &v);
        nodes.push(rule);
    }
    let header = format!(
        "Recording rules for the GPUs that scrape job {} exports, for the compute units of\nscrape job {}, written by `ceems tool tsdb create-recording-rules`.{note}",
        gpu.job, r.job
    );
    let groups = two_groups(
        r,
        ("compute-unit-gpu-rules", units),
        ("host-agg-gpu-rules", nodes),
        &gpu.job,
    );
    yaml(&header, &groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bmc_job(job: &str) -> JobRules {
        JobRules {
            job: job.into(),
            source: PowerSource::Bmc {
                series: "ceems_ipmi_dcmi_power_current_watts".into(),
                chassis: None,
            },
            rapl: false,
            gpu: None,
            rate: "2m0s".into(),
            eval: "30s".into(),
            pue: 1.5,
            generation: MetricNames::V010,
        }
    }

    #[test]
    fn placeholders_are_filled_once_and_unknown_ones_kept() {
        let filled = fill("%J% %R% 100% %X% %J", &[("J", "a%R%"), ("R", "2s")]);
        assert_eq!(filled, "a%R% 2s 100% %X% %J");
    }

    #[test]
    fn a_job_name_with_quotes_stays_inside_its_promql_string_and_yaml_scalar() {
        let text = host_rules(&bmc_job("odd \"job\": #1"), &Emissions::None);
        assert!(text.contains(r#"{job="odd \"job\": #1"}"#), "{text}");
        assert!(
            text.contains(r#"- name: "compute-unit-rules-odd \"job\": #1""#),
            "{text}"
        );
        let parsed: serde_json::Value = serde_norway::from_str(&text).unwrap();
        assert_eq!(parsed["groups"][0]["interval"], "30s");
        assert_eq!(parsed["groups"][1]["interval"], "2m0s");
    }

    #[test]
    fn emission_rules_follow_the_factor_found() {
        let records = |e: &Emissions| {
            let text = host_rules(&bmc_job("hosts"), e);
            let parsed: serde_json::Value = serde_norway::from_str(&text).unwrap();
            parsed["groups"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|g| g["rules"].as_array().unwrap().clone())
                .filter(|r| r["record"].as_str().unwrap().contains("emissions"))
                .map(|r| r["expr"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert!(records(&Emissions::None).is_empty());
        let two = Emissions::Providers {
            providers: vec!["owid".into(), "rte".into()],
            country: "FR".into(),
            instance: None,
        };
        let by_provider = records(&two);
        // One per provider for the units, one for the nodes (the series carry the provider).
        assert_eq!(by_provider.len(), 3, "{by_provider:?}");
        assert!(by_provider[1].contains(r#"provider="rte"}"#));
        assert!(by_provider[2].contains("label_replace(ceems_emissions_gCo2_kWh, \"job\""));
        // Today's: one target's factors, whichever other targets have.
        let one_target = Emissions::Providers {
            providers: vec!["owid".into()],
            country: "FR".into(),
            instance: Some("emissions:9011".into()),
        };
        let by_target = records(&one_target);
        assert!(
            by_target[0]
                .contains(r#"{country_code="FR",provider="owid",instance="emissions:9011"}"#),
            "{by_target:?}"
        );
        assert!(
            by_target[1].contains(
                r#"label_replace(ceems_emissions_gCo2_kWh{instance="emissions:9011"}, "job""#
            ),
            "{by_target:?}"
        );
        let fixed = Emissions::Static {
            provider: "custom".into(),
            factor: 50.0,
            country: "DE".into(),
        };
        let fixed = records(&fixed);
        assert_eq!(fixed.len(), 2);
        assert!(fixed[0].trim_end().ends_with("* 50"), "{}", fixed[0]);
        assert!(fixed[1].contains(r#""country_code", "DE""#), "{}", fixed[1]);
    }

    #[test]
    fn todays_rules_add_the_io_and_network_groups() {
        let mut job = bmc_job("hosts");
        let names = |job: &JobRules| {
            let parsed: serde_json::Value =
                serde_norway::from_str(&host_rules(job, &Emissions::None)).unwrap();
            parsed["groups"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| g["name"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&job).len(), 2);
        job.generation = MetricNames::Current;
        assert_eq!(
            names(&job),
            [
                "compute-unit-rules-hosts",
                "host-agg-rules-hosts",
                "compute-unit-io-rules-hosts",
                "host-agg-io-rules-hosts",
                "compute-unit-network-rules-hosts",
                "host-agg-network-rules-hosts"
            ]
        );
        let text = host_rules(&job, &Emissions::None);
        assert!(
            text.contains("expr: irate(ceems_ebpf_read_bytes_total{job=\"hosts\"}[2m0s])\n"),
            "{text}"
        );
    }

    #[test]
    fn a_bmc_that_counts_the_gpus_in_has_them_taken_out() {
        let mut job = bmc_job("gpu-hosts");
        job.gpu = Some(GpuRules {
            exporter: &exprs::AMD_SMI,
            job: "amd".into(),
            power_in_host: true,
            profiling: Vec::new(),
            metric_prefix: "",
        });
        let text = host_rules(&job, &Emissions::None);
        assert!(
            text.contains(
                r#"sum by (instancehost) (label_replace(amd_gpu_power{job="amd"} / 1000000,"#
            ),
            "{text}"
        );
        job.gpu.as_mut().unwrap().power_in_host = false;
        let text = host_rules(&job, &Emissions::None);
        assert!(!text.contains("instancehost"), "{text}");
        assert!(
            text.contains("expr: 1.5 * ceems_ipmi_dcmi_power_current_watts{job=\"gpu-hosts\"}\n"),
            "{text}"
        );
    }
}
