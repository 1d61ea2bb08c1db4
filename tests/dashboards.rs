//! CEEMS's own Grafana dashboards (`fixtures/ceems-api/grafana/dashboards`) as the client of
//! our series: every series name in their PromQL is a family the exporter exports or a series
//! our recording rules (`examples/prometheus/rules`) record, so no panel stays empty for want
//! of a name; and a real Prometheus that loads those rules records every one of them.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, ext, out);
        } else if path.to_string_lossy().ends_with(ext) {
            out.push(path);
        }
    }
}

/// Every `expr` of a dashboard, wherever it sits (panels, rows, templating).
fn exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(list) => list.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

/// The series names a PromQL text reads: CEEMS's families (`ceems_…`) and recorded series
/// (`level:ceems_…:operations`), Grafana's variables (`$job`, `${job:pipe}`) left out.
fn series_names(expr: &str) -> BTreeSet<String> {
    let variables = regex::Regex::new(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*").unwrap();
    let names =
        regex::Regex::new(r#"(?:^|[^A-Za-z0-9_:"])((?:[a-z]+:)?ceems_[A-Za-z0-9_:]*)"#).unwrap();
    let text = variables.replace_all(expr, " ");
    names
        .captures_iter(&text)
        .map(|c| c[1].to_owned())
        .collect()
}

/// What our rules record.
fn recorded() -> BTreeSet<String> {
    let mut rules = Vec::new();
    files(
        &root().join("examples/prometheus/rules"),
        ".rules.yml",
        &mut rules,
    );
    assert!(rules.len() >= 2, "{rules:?}");
    rules
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .filter_map(|l| {
                    l.trim()
                        .strip_prefix("- record:")
                        .map(|n| n.trim().to_owned())
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Whether the exporter exports the family `name`: named in its source, or one of its perf
/// events' families.
fn exported(name: &str, sources: &str) -> bool {
    sources.contains(&format!("\"{name}\""))
        || ceems::host::perf::EVENTS
            .iter()
            .any(|e| format!("ceems_perf_{}_total", e.metric) == name)
}

#[test]
fn every_series_of_ceems_s_dashboards_is_exported_or_recorded() {
    let dashboards = dashboards();
    let mut sources = Vec::new();
    files(&root().join("src"), ".rs", &mut sources);
    let sources: String = sources
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    let recorded = recorded();
    let wanted = dashboards_series(&dashboards);
    let names: BTreeSet<&str> = wanted.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        names.len() >= 55,
        "only {} names found: {names:?}",
        names.len()
    );
    let missing: Vec<&(String, String)> = wanted
        .iter()
        .filter(|(name, _)| match name.contains(':') {
            true => !recorded.contains(name),
            false => !exported(name, &sources),
        })
        .collect();
    assert!(
        missing.is_empty(),
        "series CEEMS's dashboards plot that nothing gives: {missing:#?}"
    );
}

/// CEEMS's seven dashboards.
fn dashboards() -> Vec<PathBuf> {
    let mut dashboards = Vec::new();
    files(
        &root().join("tests/fixtures/ceems-api/grafana/dashboards"),
        ".json",
        &mut dashboards,
    );
    assert_eq!(dashboards.len(), 7, "{dashboards:?}");
    dashboards
}

/// (series name, dashboard file) of every name the dashboards' PromQL reads.
fn dashboards_series(dashboards: &[PathBuf]) -> BTreeSet<(String, String)> {
    let mut wanted = BTreeSet::new();
    for path in dashboards {
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut found = Vec::new();
        exprs(&json, &mut found);
        for expr in found {
            for name in series_names(&expr) {
                wanted.insert((
                    name,
                    path.file_name().unwrap().to_string_lossy().into_owned(),
                ));
            }
        }
    }
    wanted
}

#[test]
fn the_name_finder_skips_variables_and_labels() {
    let found = series_names(
        r#"sum by (uuid) (uuid:ceems_gpu_usage:ratio{uuid=~"$jobid", job="${job:pipe}"}) / ceems_compute_unit_cpus{manager="ceems_x"}"#,
    );
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        ["ceems_compute_unit_cpus", "uuid:ceems_gpu_usage:ratio"]
    );
}

/// One group of input series of a `promtool test rules` file, each as its series and the
/// start and step of its values (`400x10`: 400 then 400; `0+60x10`: 0, 60, 120…).
type InputSeries = Vec<(String, f64, f64)>;

/// Every group of input series of a `promtool test rules` file.
fn input_groups(test_file: &Path) -> Vec<InputSeries> {
    let text = std::fs::read_to_string(test_file).unwrap();
    let yaml: serde_norway::Value = serde_norway::from_str(&text).unwrap();
    let number = r"[+-]?[0-9.]+(?:e[+-]?[0-9]+)?";
    let values = regex::Regex::new(&format!(r"^({number})(?:([+-])({number}))?x[0-9]+$")).unwrap();
    let mut groups = Vec::new();
    for test in yaml["tests"].as_sequence().unwrap() {
        let mut group: InputSeries = Vec::new();
        for input in test["input_series"].as_sequence().unwrap() {
            let series = input["series"].as_str().unwrap().to_owned();
            let Some(c) = values.captures(input["values"].as_str().unwrap().trim()) else {
                continue;
            };
            let start: f64 = c[1].parse().unwrap();
            let step: f64 = c.get(3).map_or(0.0, |m| m.as_str().parse().unwrap());
            let step = if c.get(2).is_some_and(|m| m.as_str() == "-") {
                -step
            } else {
                step
            };
            if !group.iter().any(|(s, _, _)| *s == series) {
                group.push((series, start, step));
            }
        }
        groups.push(group);
    }
    groups
}

/// Every recorded series CEEMS's dashboards read, recorded by a real Prometheus (Debian's)
/// that loads our rules and scrapes, over HTTP, the input series of the rules' unit tests
/// (one target per test group, their own `instance` and `job` labels kept).
#[test]
fn a_real_prometheus_records_every_series_the_dashboards_read() {
    if !common::runnable(
        "a_real_prometheus_records_every_series_the_dashboards_read",
        common::lab::prometheus_tools(),
    ) {
        return;
    }
    let rules_dir = root().join("examples/prometheus/rules");
    let mut tests = Vec::new();
    files(&rules_dir.join("tests"), ".test.yml", &mut tests);
    tests.sort();
    // The v0.10 host-power file records the same names as the current one, from older inputs.
    tests.retain(|t| !t.to_string_lossy().contains("v0.10"));
    assert!(tests.len() >= 4, "{tests:?}");
    // One target per group, its `k`th scrape answering each series' `k`th value, so that
    // counters grow and their rates are recorded too.
    let mut servers: Vec<(String, common::http::TestServer)> = Vec::new();
    for t in &tests {
        let file = t
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace(".test.yml", "");
        for (i, group) in input_groups(t).into_iter().enumerate() {
            assert!(!group.is_empty(), "{}", t.display());
            let scrapes = std::sync::atomic::AtomicU64::new(0);
            let server = common::http::TestServer::start(
                false,
                Arc::new(move |_: &common::http::Request| {
                    let k = scrapes.fetch_add(1, std::sync::atomic::Ordering::Relaxed) as f64;
                    let body: String = group
                        .iter()
                        .map(|(series, start, step)| format!("{series} {}\n", start + step * k))
                        .collect();
                    common::http::Response::raw(200, body)
                        .with_header("Content-Type", "text/plain; version=0.0.4")
                }),
            );
            servers.push((format!("{file}-{i}"), server));
        }
    }
    let jobs: String = servers
        .iter()
        .map(|(name, s)| {
            format!(
                "  - job_name: {name}\n    honor_labels: true\n    static_configs:\n      - targets: ['127.0.0.1:{}']\n        labels: {{rules_test: {name}}}\n",
                s.port
            )
        })
        .collect();
    let mut rules = Vec::new();
    files(&rules_dir, ".rules.yml", &mut rules);
    rules.retain(|r| !r.to_string_lossy().contains("v0.10"));
    let rules: Vec<&Path> = rules.iter().map(PathBuf::as_path).collect();
    let prometheus = common::lab::Prometheus::start_with(&[], "1s", &rules, &jobs);
    let wanted: BTreeSet<String> = dashboards_series(&dashboards())
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| name.contains(':'))
        .collect();
    assert!(wanted.len() >= 20, "{wanted:?}");
    let start = Instant::now();
    loop {
        let missing: Vec<&String> = wanted
            .iter()
            .filter(|name| {
                prometheus
                    .query(&format!("count({{__name__=\"{name}\"}})"))
                    .is_empty()
            })
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not recorded by a real Prometheus: {missing:#?}\ntargets: {:?}",
            prometheus.targets_up()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
