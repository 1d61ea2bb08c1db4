//! `tsdb create-ceems-tsdb-updater-queries`: the stats-server's TSDB updater queries for the
//! recorded series this Prometheus has (and, for emissions, the providers it has), printed as
//! CEEMS's tool prints them. `{{.UUIDs}}`, `{{.Range}}` and the scrape interval's placeholders
//! are the updater's, left as they are.

use crate::collect::MetricNames;

/// How one aggregate of one metric is computed from a recorded series (`%s`).
struct UpdaterQuery {
    metric: &'static str,
    key: &'static str,
    series: &'static str,
    query: &'static str,
}

const MEAN: &str =
    r#"avg_over_time(avg by (uuid) (%s{uuid=~"{{.UUIDs}}"} > 0 < inf)[{{.Range}}:])"#;
const ENERGY: &str = r#"sum_over_time(sum by (uuid) (%s{uuid=~"{{.UUIDs}}"} > 0 < inf)[{{.Range}}:{{.ScrapeInterval}}]) * {{.ScrapeIntervalMilli}} / 3.6e9"#;
const RTE: &str = r#"sum_over_time(sum by (uuid) (%s{uuid=~"{{.UUIDs}}",provider="rte"} > 0 < inf)[{{.Range}}:{{.ScrapeInterval}}]) * {{.ScrapeIntervalMilli}} / 1e3"#;
const EMAPS: &str = r#"sum_over_time(sum by (uuid) (%s{uuid=~"{{.UUIDs}}",provider="emaps"} > 0 < inf)[{{.Range}}:{{.ScrapeInterval}}]) * {{.ScrapeIntervalMilli}} / 1e3"#;
const OWID: &str = r#"sum_over_time(sum by (uuid) (%s{uuid=~"{{.UUIDs}}",provider="owid"} > 0 < inf)[{{.Range}}:{{.ScrapeInterval}}]) * {{.ScrapeIntervalMilli}} / 1e3"#;
/// WattTime's factors (CEEMS v0.12+).
const WT: &str = r#"sum_over_time(sum by (uuid) (%s{uuid=~"{{.UUIDs}}",provider="wt"} > 0 < inf)[{{.Range}}:{{.ScrapeInterval}}]) * {{.ScrapeIntervalMilli}} / 1e3"#;

const fn q(
    metric: &'static str,
    key: &'static str,
    series: &'static str,
    query: &'static str,
) -> UpdaterQuery {
    UpdaterQuery {
        metric,
        key,
        series,
        query,
    }
}

/// Every query, sorted by metric, then by key (the order they are printed in).
const QUERIES: &[UpdaterQuery] = &[
    q(
        "avg_cpu_mem_usage",
        "global",
        "uuid:ceems_cpu_memory_usage:ratio",
        MEAN,
    ),
    q(
        "avg_cpu_usage",
        "global",
        "uuid:ceems_cpu_usage:ratio_irate",
        MEAN,
    ),
    q(
        "avg_gpu_mem_usage",
        "global",
        "uuid:ceems_gpu_memory_usage:ratio",
        MEAN,
    ),
    q(
        "avg_gpu_usage",
        "global",
        "uuid:ceems_gpu_usage:ratio",
        MEAN,
    ),
    q(
        "total_cpu_emissions_gms",
        "emaps_total",
        "uuid:ceems_host_emissions_g_s:pue",
        EMAPS,
    ),
    q(
        "total_cpu_emissions_gms",
        "owid_total",
        "uuid:ceems_host_emissions_g_s:pue",
        OWID,
    ),
    q(
        "total_cpu_emissions_gms",
        "rte_total",
        "uuid:ceems_host_emissions_g_s:pue",
        RTE,
    ),
    q(
        "total_cpu_emissions_gms",
        "wt_total",
        "uuid:ceems_host_emissions_g_s:pue",
        WT,
    ),
    q(
        "total_cpu_energy_usage_kwh",
        "total",
        "uuid:ceems_host_power_watts:pue",
        ENERGY,
    ),
    q(
        "total_gpu_emissions_gms",
        "emaps_total",
        "uuid:ceems_gpu_emissions_g_s:pue",
        EMAPS,
    ),
    q(
        "total_gpu_emissions_gms",
        "owid_total",
        "uuid:ceems_gpu_emissions_g_s:pue",
        OWID,
    ),
    q(
        "total_gpu_emissions_gms",
        "rte_total",
        "uuid:ceems_gpu_emissions_g_s:pue",
        RTE,
    ),
    q(
        "total_gpu_emissions_gms",
        "wt_total",
        "uuid:ceems_gpu_emissions_g_s:pue",
        WT,
    ),
    q(
        "total_gpu_energy_usage_kwh",
        "total",
        "uuid:ceems_gpu_power_watts:pue",
        ENERGY,
    ),
];

/// The recorded series the queries read.
pub fn series() -> Vec<&'static str> {
    let mut names: Vec<&str> = QUERIES.iter().map(|q| q.series).collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// The series whose `provider` label says which emission factors Prometheus has.
pub const PROVIDER_SERIES: &str = "uuid:ceems_host_emissions_g_s:pue";

/// The `queries` section for the series found and the providers found (`owid`, …), in the
/// layout CEEMS's template gives it (its blank lines included). Today's CEEMS writes PromQL
/// strings in backticks and has WattTime's factors; v0.10 wrote double quotes.
pub fn queries(found: &[String], providers: &[String], names: MetricNames) -> String {
    let mut out = String::from("---\n\nqueries:");
    let mut metric = "";
    for query in QUERIES {
        if names == MetricNames::V010 && query.key == "wt_total" {
            continue;
        }
        if query.metric != metric {
            if !metric.is_empty() {
                out.push('\n');
            }
            metric = query.metric;
            out.push_str(&format!("\n  {metric}:"));
        }
        let has_series = found.iter().any(|f| f == query.series);
        let has_provider = !query.series.contains("emissions")
            || providers.iter().any(|p| format!("{p}_total") == query.key);
        if has_series && has_provider {
            let text = query.query.replacen("%s", query.series, 1);
            let text = names.pick(text.replace('"', "`"), text);
            out.push_str(&format!("\n    {}: {}", query.key, text));
        }
        out.push('\n');
    }
    out.push_str("\n\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_prometheus_has_is_asked() {
        let text = queries(
            &[
                "uuid:ceems_host_emissions_g_s:pue".into(),
                "uuid:ceems_cpu_usage:ratio_irate".into(),
            ],
            &["owid".into(), "wt".into()],
            MetricNames::V010,
        );
        assert!(!text.contains("wt_total"), "v0.10 had no WattTime: {text}");
        assert!(text.contains("\n    owid_total: sum_over_time(sum by (uuid) (uuid:ceems_host_emissions_g_s:pue{uuid=~\"{{.UUIDs}}\",provider=\"owid\"}"));
        assert!(!text.contains("rte_total:"));
        assert!(text.contains(
            "\n    global: avg_over_time(avg by (uuid) (uuid:ceems_cpu_usage:ratio_irate{"
        ));
        assert!(!text.contains("ratio{uuid"), "{text}");
        assert_eq!(series().len(), 8);
        let today = queries(
            &["uuid:ceems_host_emissions_g_s:pue".into()],
            &["wt".into()],
            MetricNames::Current,
        );
        assert!(
            today.contains("\n    wt_total: sum_over_time(sum by (uuid) (uuid:ceems_host_emissions_g_s:pue{uuid=~`{{.UUIDs}}`,provider=`wt`} > 0 < inf)"),
            "{today}"
        );
    }
}
