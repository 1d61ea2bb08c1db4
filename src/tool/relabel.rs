//! `tsdb create-relabel-configs`: the `metric_relabel_configs` that give the GPU exporters'
//! series (NVIDIA's DCGM, AMD's SMI and device-metrics exporters) the labels ceems's GPU
//! series have (`gpuuuid`, `gpuiid`, `index`), for each scrape job that exports them, written
//! as CEEMS's tool writes them.

use super::Jobs;

/// The series that tell each GPU exporter apart.
pub const GPU_SERIES: [&str; 3] = [
    "DCGM_FI_DEV_POWER_USAGE_INSTANT",
    "amd_gpu_power",
    "gpu_power_usage",
];

/// One relabel rule: `replace` from source labels, or `labeldrop`.
enum Rule {
    Replace {
        sources: &'static [&'static str],
        target: &'static str,
        regex: &'static str,
        replacement: &'static str,
    },
    Drop(&'static str),
}

/// DCGM: the GPU's UUID and MIG instance, only on NVIDIA's series (the model name says so), so
/// ceems's own `gpuuuid` and `gpuiid` stay when the rules run on its targets too.
const DCGM: &[Rule] = &[
    Rule::Replace {
        sources: &["modelName", "UUID"],
        target: "gpuuuid",
        regex: "NVIDIA(.*);(.*)",
        replacement: "$2",
    },
    Rule::Replace {
        sources: &["modelName", "GPU_I_ID"],
        target: "gpuiid",
        regex: "NVIDIA(.*);(.*)",
        replacement: "$2",
    },
    Rule::Drop("UUID"),
    Rule::Drop("GPU_I_ID"),
];

/// AMD SMI: each series names the GPU's index in a label of its own name.
const AMD_SMI: &[Rule] = &[
    Rule::Replace {
        sources: &["gpu_power"],
        target: "index",
        regex: "(.*)",
        replacement: "$1",
    },
    Rule::Replace {
        sources: &["index", "gpu_use_percent"],
        target: "index",
        regex: ";(.+)",
        replacement: "$1",
    },
    Rule::Replace {
        sources: &["index", "gpu_memory_use_percent"],
        target: "index",
        regex: ";(.+)",
        replacement: "$1",
    },
    Rule::Drop("gpu_power"),
    Rule::Drop("gpu_use_percent"),
    Rule::Drop("gpu_memory_use_percent"),
];

/// AMD device metrics: `gpu_id` and `gpu_partition_id` as ceems's `index` and `gpuiid`.
const AMD_DEVICE_METRICS: &[Rule] = &[
    Rule::Replace {
        sources: &["gpu_id"],
        target: "index",
        regex: "(.*)",
        replacement: "$1",
    },
    Rule::Replace {
        sources: &["gpu_partition_id"],
        target: "gpuiid",
        regex: "(.*)",
        replacement: "$1",
    },
    Rule::Drop("gpu_id"),
    Rule::Drop("gpu_partition_id"),
];

/// A YAML scalar as yaml.v3 writes it: plain when it can be, else double-quoted.
fn scalar(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./$()*;+:".contains(c))
        && !text.starts_with(['-', ':', '*'])
        && !text.ends_with(':')
        && !matches!(
            text,
            "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "~"
        )
        && text.parse::<f64>().is_err();
    match plain {
        true => text.to_owned(),
        false => serde_json::Value::from(text).to_string(),
    }
}

/// The `scrape_configs` to merge into Prometheus's config, as YAML.
pub fn scrape_configs(jobs: &Jobs) -> String {
    let mut out = String::from("scrape_configs:");
    let mut any = false;
    for job in &jobs.order {
        let rules = if jobs.has(job, GPU_SERIES[0]) {
            DCGM
        } else if jobs.has(job, GPU_SERIES[1]) {
            AMD_SMI
        } else if jobs.has(job, GPU_SERIES[2]) {
            AMD_DEVICE_METRICS
        } else {
            continue;
        };
        any = true;
        out.push_str(&format!(
            "\n  - job: {}\n    metric_relabel_configs:",
            scalar(job)
        ));
        for rule in rules {
            match rule {
                Rule::Replace {
                    sources,
                    target,
                    regex,
                    replacement,
                } => {
                    out.push_str("\n      - source_labels:");
                    for s in *sources {
                        out.push_str(&format!("\n          - {s}"));
                    }
                    out.push_str(&format!(
                        "\n        target_label: {target}\n        regex: {regex}\n        replacement: {replacement}\n        action: replace"
                    ));
                }
                Rule::Drop(label) => {
                    out.push_str(&format!(
                        "\n      - regex: {label}\n        action: labeldrop"
                    ));
                }
            }
        }
    }
    if !any {
        out.push_str(" []");
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn only_jobs_of_gpu_exporters_get_rules_and_the_yaml_reads_back() {
        let s = |job: &str, name: &str| -> BTreeMap<String, String> {
            [("job", job), ("__name__", name), ("instance", "h:1")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        };
        let jobs = Jobs::of(&[
            s("dcgm", GPU_SERIES[0]),
            s("node", "up"),
            s("amd", GPU_SERIES[2]),
        ]);
        let yaml = scrape_configs(&jobs);
        let v: serde_norway::Value = serde_norway::from_str(&yaml).unwrap();
        let list = v["scrape_configs"].as_sequence().unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0]["job"].as_str(), Some("dcgm"));
        assert_eq!(
            list[0]["metric_relabel_configs"][0]["regex"].as_str(),
            Some("NVIDIA(.*);(.*)")
        );
        assert_eq!(
            list[1]["metric_relabel_configs"][2]["action"].as_str(),
            Some("labeldrop")
        );
        assert_eq!(scrape_configs(&Jobs::default()), "scrape_configs: []\n");
        assert_eq!(scalar("a: b"), "\"a: b\"");
        assert_eq!(scalar("true"), "\"true\"");
    }
}
