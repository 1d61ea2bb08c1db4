//! The rules of today's CEEMS (v0.11 and later) where they differ from v0.10's: each scrape
//! job's IO and network groups, and GPU rules that relabel the GPU exporters' series
//! themselves (no `metric_relabel_configs` needed) and record DCGM's and AMD's profiling
//! series as `uuid:ceems_gpu_prof_*`.

use super::{exprs, fill, Group, JobRules, Rule};

/// Today's IO and network groups of a scrape job: each unit's rates of eBPF's counters, and
/// the job's totals by mount point and by protocol, all at the units' interval.
pub(super) fn io_and_network_groups(r: &JobRules, v: &[(&str, &str)]) -> Vec<Group> {
    let unit_rules = |kind: &str, rates: &[(&str, &str)]| -> Vec<Rule> {
        rates
            .iter()
            .map(|(what, counter)| Rule {
                comment: "",
                record: format!("uuid:ceems_{kind}_{what}:irate"),
                labels: Vec::new(),
                expr: fill(&exprs::unit_rate(counter), v),
            })
            .collect()
    };
    let total_rules = |kind: &str, rates: &[(&str, &str)], labels: &str| -> Vec<Rule> {
        rates
            .iter()
            .map(|(what, counter)| Rule {
                comment: "",
                record: format!("job:ceems_{kind}_{what}:sum_irate"),
                labels: Vec::new(),
                expr: exprs::total_rate(counter, labels),
            })
            .collect()
    };
    let group = |name: &str, rules: Vec<Rule>| Group {
        name: format!("{name}-{}", r.job),
        interval: r.eval.clone(),
        rules,
    };
    vec![
        group("compute-unit-io-rules", unit_rules("io", &exprs::IO_RATES)),
        group(
            "host-agg-io-rules",
            total_rules("io", &exprs::IO_RATES, "mountpoint"),
        ),
        group(
            "compute-unit-network-rules",
            unit_rules("net", &exprs::NET_RATES),
        ),
        group(
            "host-agg-network-rules",
            total_rules("net", &exprs::NET_RATES, "family, proto"),
        ),
    ]
}

use super::{emission_rules, gpu_file, promql_string, values, Emissions, GpuRules};

/// The GPU index flag of the job's units.
const FLAG: &str = r#"ceems_compute_unit_gpu_index_flag{job="%J%"}"#;
/// The job's units' shares of SMs.
const SM_COUNT: &str = r#"ceems_compute_unit_gpu_sm_count{job="%J%"}"#;

/// A DCGM series of the GPU job with ceems's GPU labels (`gpuuuid`, `gpuiid`).
fn dcgm(series: &str) -> String {
    format!(
        r#"label_replace(label_replace({series}{{job="%G%"}}, "gpuuuid", "$1", "UUID", "(.*)"), "gpuiid", "$1", "GPU_I_ID", "(.*)")"#
    )
}

/// An AMD SMI series of the GPU job with ceems's `index` (from its own label `label`).
fn smi(series: &str, label: &str) -> String {
    format!(r#"label_replace({series}{{job="%G%"}}, "index", "$1", "{label}", "(.*)")"#)
}

/// An AMD device metrics series of the GPU job with ceems's `gpuuuid` and `gpuiid`.
fn device_metrics(series: &str) -> String {
    format!(
        r#"label_replace(label_replace({series}{{job="%G%"}}, "gpuuuid", "$1", "serial_number", "(.*)"), "gpuiid", "$1", "gpu_partition_id", "(.*)")"#
    )
}

/// `what` joined to the units' GPU index flags on `on`.
fn per_unit(what: &str, on: &str) -> String {
    format!("{what}\n* on ({on}) group_right ()\n{FLAG}")
}

/// A unit's GPU power: its share of the GPU's SMs (`by`: the device label) times the
/// device's power record `device` (joined on `join`), given to the units' flags (joined on
/// `to_units`).
fn sm_share_power(by: &str, device: &str, join: &str, to_units: &str) -> String {
    format!(
        "(\n    {SM_COUNT}\n  / on ({by}) group_left ()\n    (sum by ({by}) ({SM_COUNT}) > 0)\n)\n  * on ({join}) group_left ()\n    {device}\n* on ({to_units}) group_right ()\n  {FLAG}"
    )
}

/// NVIDIA: a unit's GPU power by the SMs' activity and occupancy (DCGM's profiling series).
fn dcgm_active_power() -> String {
    let product = format!(
        "(\n      {}\n    * on (gpuuuid, gpuiid)\n      {}\n  * on (gpuuuid, gpuiid) group_right ()\n    {SM_COUNT}\n)",
        dcgm("DCGM_FI_PROF_SM_ACTIVE"),
        dcgm("DCGM_FI_PROF_SM_OCCUPANCY")
    );
    format!(
        "(\n  ({product})\n/ on (gpuuuid) group_left ()\n  (sum by (gpuuuid) ({product} > 0))\n)\n  * on (gpuuuid,gpuiid) group_left ()\n    dev:DCGM_FI_DEV_POWER_USAGE_INSTANT:pue{{job=\"%G%\"}}\n* on (gpuuuid,gpuiid,uuid) group_right ()\n  {FLAG}"
    )
}

/// A rule of `record` for `expr`, with `labels`.
fn rule(record: String, labels: Vec<(&'static str, &'static str)>, expr: String) -> Rule {
    Rule {
        comment: "",
        record,
        labels,
        expr,
    }
}

/// The unit and node rules of one exporter, before the emission rules are added.
struct ExporterRules {
    units: Vec<Rule>,
    profiling: Vec<Rule>,
    nodes: Vec<Rule>,
}

fn nvidia(gpu: &GpuRules) -> ExporterRules {
    let has = |s: &str| gpu.profiling.iter().any(|p| p == s);
    let (usage, factor) = match has("DCGM_FI_PROF_GR_ENGINE_ACTIVE") {
        true => ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 100),
        false => ("DCGM_FI_DEV_GPU_UTIL", 1),
    };
    let on = "gpuuuid,gpuiid";
    let used = dcgm("DCGM_FI_DEV_FB_USED");
    let power = match has("DCGM_FI_PROF_SM_ACTIVE") && has("DCGM_FI_PROF_SM_OCCUPANCY") {
        true => dcgm_active_power(),
        false => sm_share_power(
            "gpuuuid",
            r#"dev:DCGM_FI_DEV_POWER_USAGE_INSTANT:pue{job="%G%"}"#,
            on,
            "gpuuuid,gpuiid,uuid",
        ),
    };
    let units = vec![
        rule(
            "uuid:ceems_gpu_usage:ratio".into(),
            vec![],
            per_unit(&format!("{} * {factor}", dcgm(usage)), on),
        ),
        rule(
            "uuid:ceems_gpu_memory_usage:ratio".into(),
            vec![],
            per_unit(
                &format!(
                    "(\n    {used} * 100\n  /\n    ({used} + {})\n)",
                    dcgm("DCGM_FI_DEV_FB_FREE")
                ),
                on,
            ),
        ),
        rule(
            "dev:DCGM_FI_DEV_POWER_USAGE_INSTANT:pue".into(),
            vec![],
            format!("%P% * {}", dcgm("DCGM_FI_DEV_POWER_USAGE_INSTANT")),
        ),
        rule("uuid:ceems_gpu_power_watts:pue".into(), vec![], power),
    ];
    // DCGM_FI_PROF_SM_ACTIVE → uuid:ceems_gpu_prof_sm_active:ratio (%); byte counters as rates.
    let profiling = gpu
        .profiling
        .iter()
        .map(|p| {
            let name = p.trim_start_matches("DCGM_FI_").to_lowercase();
            let (suffix, factor) = match p.contains("BYTES") {
                true => ("rate", 1),
                false => ("ratio", 100),
            };
            rule(
                format!("uuid:ceems_gpu_{name}:{suffix}"),
                vec![],
                per_unit(&format!("{} * {factor}", dcgm(p)), on),
            )
        })
        .collect();
    ExporterRules {
        units,
        profiling,
        nodes: node_rules(&exprs::DCGM),
    }
}

/// The scrape job's GPU usage, memory use and power, as v0.10 wrote them too.
fn node_rules(x: &exprs::GpuExporter) -> Vec<Rule> {
    vec![
        rule(
            "job:ceems_gpu_usage:avg".into(),
            vec![],
            x.jobs_usage.into(),
        ),
        rule(
            "job:ceems_gpu_memory_usage:avg_ratio".into(),
            vec![],
            x.jobs_memory_usage.into(),
        ),
        rule(
            "job:ceems_gpu_power_watts:pue".into(),
            vec![],
            x.jobs_power.into(),
        ),
    ]
}

fn amd_smi() -> ExporterRules {
    ExporterRules {
        units: vec![
            rule(
                "uuid:ceems_gpu_usage:ratio".into(),
                vec![],
                per_unit(&smi("amd_gpu_use_percent", "gpu_use_percent"), "index"),
            ),
            rule(
                "uuid:ceems_gpu_memory_usage:ratio".into(),
                vec![],
                per_unit(
                    &smi("amd_gpu_memory_use_percent", "gpu_memory_use_percent"),
                    "index",
                ),
            ),
            rule(
                "dev:amd_gpu_power_watts:pue".into(),
                vec![],
                format!("%P% * {} / 1e6", smi("amd_gpu_power", "gpu_power")),
            ),
            rule(
                "uuid:ceems_gpu_power_watts:pue".into(),
                vec![],
                sm_share_power(
                    "index",
                    r#"dev:amd_gpu_power_watts:pue{job="%G%"}"#,
                    "index",
                    "index",
                ),
            ),
        ],
        profiling: Vec::new(),
        nodes: node_rules(&exprs::AMD_SMI),
    }
}

/// AMD's device metrics exporter: memory by kind (VRAM, GTT, visible VRAM), power from
/// partition 0 (the others report none), and its profiling series.
fn amd_device_metrics(gpu: &GpuRules) -> ExporterRules {
    let x = gpu.metric_prefix;
    let on = "gpuuuid,gpuiid";
    // (type label, used, total, and the node rule's names as CEEMS writes them).
    let kinds = [
        ("vram", "used_vram", "total_vram", "used_vram", "total_vram"),
        ("gtt", "used_gtt", "total_gtt", "used_gtt", "total_gtt"),
        (
            "visiblevram",
            "used_visible_vram",
            "total_visible_vram",
            "used_visible_ram",
            "total_visible_ram",
        ),
    ];
    let mut units = vec![rule(
        "uuid:ceems_gpu_usage:ratio".into(),
        vec![],
        per_unit(&device_metrics(&format!("{x}gpu_gfx_activity")), on),
    )];
    for (kind, used, total, _, _) in kinds {
        units.push(rule(
            "uuid:ceems_gpu_memory_usage:ratio".into(),
            vec![("type", kind)],
            per_unit(
                &format!(
                    "(\n    {} * 100\n  /\n    {} > 0\n)",
                    device_metrics(&format!("{x}gpu_{used}")),
                    device_metrics(&format!("{x}gpu_{total}"))
                ),
                on,
            ),
        ));
    }
    units.push(rule(
        "dev:gpu_power_usage_watts:pue".into(),
        vec![],
        format!("%P% * {}", device_metrics(&format!("{x}gpu_package_power"))),
    ));
    units.push(rule(
        "uuid:ceems_gpu_power_watts:pue".into(),
        vec![],
        sm_share_power(
            "gpuuuid",
            r#"dev:gpu_power_usage_watts:pue{job="%G%",gpuiid="0"}"#,
            "gpuuuid",
            "gpuuuid,gpuiid,uuid",
        ),
    ));
    let profiling = gpu
        .profiling
        .iter()
        .map(|p| {
            let name = p.trim_start_matches(&format!("{x}gpu_")).to_lowercase();
            let suffix = match p.contains("active") || p.contains("percent") {
                true => "ratio",
                false => "sum",
            };
            rule(
                format!("uuid:ceems_gpu_{name}:{suffix}"),
                vec![],
                per_unit(&device_metrics(p), on),
            )
        })
        .collect();
    let mut nodes = vec![rule(
        "job:ceems_gpu_usage:avg".into(),
        vec![],
        format!(r#"avg by (job) ({x}gpu_gfx_activity{{job="%G%"}})"#),
    )];
    for (kind, _, _, used, total) in kinds {
        nodes.push(rule(
            "job:ceems_gpu_memory_usage:avg_ratio".into(),
            vec![("type", kind)],
            format!(
                r#"avg by (job) (({x}gpu_{used}{{job="%G%"}} * 100 / {x}gpu_{total}{{job="%G%"}} > 0))"#
            ),
        ));
    }
    nodes.push(rule(
        "job:ceems_gpu_power_watts:pue".into(),
        vec![],
        format!(r#"sum by (job)(%P% * {x}gpu_package_power{{job="%G%"}})"#),
    ));
    ExporterRules {
        units,
        profiling,
        nodes,
    }
}

/// Today's GPU rules of a scrape job's GPUs (`GPUJOB-gpu.rules`).
pub(super) fn gpu_rules(r: &JobRules, gpu: &GpuRules, e: &Emissions) -> String {
    let pue = r.pue.to_string();
    let escaped = [
        promql_string(&r.job),
        promql_string(&gpu.job),
        String::new(),
    ];
    let v = values(r, &escaped, &pue);
    let rules = if gpu.exporter.power_series == exprs::DCGM.power_series {
        nvidia(gpu)
    } else if gpu.exporter.power_series == exprs::AMD_SMI.power_series {
        amd_smi()
    } else {
        amd_device_metrics(gpu)
    };
    let filled = |rules: Vec<Rule>, v: &[(&str, &str)]| -> Vec<Rule> {
        rules
            .into_iter()
            .map(|mut r| {
                r.expr = fill(&r.expr, v);
                r
            })
            .collect()
    };
    let mut units = filled(rules.units, &v);
    // CEEMS's emission rules read the units' GPU power under the units' job, its static
    // factor's under the GPU exporter's.
    let by_provider = fill(r#"uuid:ceems_gpu_power_watts:pue{job="%J%"} / 3.6e+06"#, &v);
    let fixed = fill(r#"uuid:ceems_gpu_power_watts:pue{job="%G%"} / 3.6e+06"#, &v);
    units.extend(emission_rules(
        e,
        "uuid:ceems_gpu_emissions_g_s:pue",
        "",
        &exprs::emissions_by_provider(&by_provider, false),
        &exprs::emissions_static(&fixed),
    ));
    units.extend(filled(rules.profiling, &v));
    let nodes = filled(rules.nodes, &v);
    gpu_file(
        r,
        gpu,
        e,
        (units, nodes),
        &v,
        " They give the\nGPU exporter's series ceems's GPU labels: no relabel config is needed.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::MetricNames;
    use crate::tool::rules::{discover, PowerSource};

    /// A rule as Prometheus reads it: record, labels, expression without comments or spaces.
    type ReadRule = (String, String, String);

    /// A rules file as Prometheus reads it: per group its name, interval and rules.
    fn read(text: &str) -> Vec<(String, String, Vec<ReadRule>)> {
        let v: serde_json::Value = serde_norway::from_str(text).unwrap();
        let s = |v: &serde_json::Value| v.as_str().map(str::to_owned).unwrap_or(v.to_string());
        v["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                let rules = g["rules"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| {
                        let expr: String = s(&r["expr"])
                            .lines()
                            .map(|l| l.split('#').next().unwrap_or_default())
                            .collect::<String>()
                            .split_whitespace()
                            .collect();
                        (s(&r["record"]), r["labels"].to_string(), expr)
                    })
                    .collect();
                (s(&g["name"]), s(&g["interval"]), rules)
            })
            .collect()
    }

    /// CEEMS v0.16's files of its `tool-recording-rules` scenario (first run), by name.
    fn expected(name: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(
            "tests/fixtures/ceems-v0.16/cmd/ceems_tool/testdata/output/e2e-test-recording-rules-output-excerpt.txt",
        );
        let text = std::fs::read_to_string(path).unwrap();
        let start = text.find(&format!("{name}\n")).unwrap() + name.len() + 1;
        let rest = &text[start..];
        let end = rest
            .find(".rules\n---\n")
            .and_then(|i| rest[..i].rfind('\n'))
            .unwrap_or(rest.len());
        rest[..end].to_owned()
    }

    fn job(name: &str) -> JobRules {
        JobRules {
            job: name.into(),
            source: PowerSource::Rapl,
            rapl: true,
            gpu: None,
            rate: "2s".into(),
            eval: "1s".into(),
            pue: 1.0,
            generation: MetricNames::Current,
        }
    }

    #[test]
    fn rules_as_ceems_v016_writes_them() {
        let emissions = Emissions::Providers {
            providers: vec!["owid".into()],
            country: "FR".into(),
            instance: Some("compute-emissions:9017".into()),
        };
        let cases = [
            (
                "cpu-hwmon-amd-gpu",
                GpuRules {
                    exporter: &exprs::AMD_DEVICE_METRICS,
                    job: "amd-device-metrics-gpu".into(),
                    power_in_host: false,
                    profiling: discover::AMD_PROFILING
                        .iter()
                        .map(|p| format!("amd_gpu_{p}"))
                        .collect(),
                    metric_prefix: "amd_",
                },
            ),
            (
                "cpu-cray-amd-gpu",
                GpuRules {
                    exporter: &exprs::AMD_SMI,
                    job: "amd-smi-gpu".into(),
                    power_in_host: false,
                    profiling: Vec::new(),
                    metric_prefix: "",
                },
            ),
            (
                "cpu-ipmi-nvidia-gpu",
                GpuRules {
                    exporter: &exprs::DCGM,
                    job: "ipmi-nvidia-gpu".into(),
                    power_in_host: false,
                    profiling: discover::PROFILING.iter().map(|p| p.to_string()).collect(),
                    metric_prefix: "",
                },
            ),
        ];
        for (cpu_job, gpu) in cases {
            let ours = gpu_rules(&job(cpu_job), &gpu, &emissions);
            let theirs = expected(&format!("{}-gpu.rules", gpu.job));
            assert_same(&ours, &theirs, &gpu.job);
        }
        // The nodes' rules where the node power counts the GPUs in: an APU's hwmon socket
        // power, a BMC's with NVIDIA GPUs.
        let mut hwmon = job("cpu-hwmon-amd-gpu");
        hwmon.source = PowerSource::Hwmon;
        hwmon.gpu = Some(GpuRules {
            exporter: &exprs::AMD_DEVICE_METRICS,
            job: "amd-device-metrics-gpu".into(),
            power_in_host: true,
            profiling: Vec::new(),
            metric_prefix: "amd_",
        });
        let mut ipmi = job("cpu-ipmi-nvidia-gpu");
        ipmi.source = PowerSource::Bmc {
            series: "ceems_ipmi_dcmi_power_current_watts".into(),
            chassis: None,
        };
        ipmi.rapl = false;
        ipmi.gpu = Some(GpuRules {
            exporter: &exprs::DCGM,
            job: "ipmi-nvidia-gpu".into(),
            power_in_host: true,
            profiling: Vec::new(),
            metric_prefix: "",
        });
        for r in [hwmon, ipmi] {
            let ours = crate::tool::rules::host_rules(&r, &emissions);
            assert_same(&ours, &expected(&format!("{}.rules", r.job)), &r.job);
        }
    }

    /// Two rules files read alike: groups, intervals, records, labels and expressions.
    fn assert_same(ours: &str, theirs: &str, name: &str) {
        let (ours, theirs) = (read(ours), read(theirs));
        let groups = |f: &[(String, String, Vec<ReadRule>)]| {
            f.iter()
                .map(|g| (g.0.clone(), g.1.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(groups(&ours), groups(&theirs), "{name}");
        for (g_ours, g_theirs) in ours.iter().zip(&theirs) {
            let records = |g: &[ReadRule]| g.iter().map(|r| r.0.clone()).collect::<Vec<_>>();
            assert_eq!(
                records(&g_ours.2),
                records(&g_theirs.2),
                "{name}: {}",
                g_ours.0
            );
            for (r_ours, r_theirs) in g_ours.2.iter().zip(&g_theirs.2) {
                assert_eq!(r_ours, r_theirs, "{name}: {}", g_ours.0);
            }
        }
    }
}
