//! CEEMS's own Grafana dashboards (`fixtures/ceems-api/grafana/dashboards`) as the client of
//! our series: every series name in their PromQL is a family the exporter exports or a series
//! our recording rules (`examples/prometheus/rules`) record, so no panel stays empty for want
//! of a name.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

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
    let mut dashboards = Vec::new();
    files(
        &root().join("tests/fixtures/ceems-api/grafana/dashboards"),
        ".json",
        &mut dashboards,
    );
    assert_eq!(dashboards.len(), 7, "{dashboards:?}");
    let mut sources = Vec::new();
    files(&root().join("src"), ".rs", &mut sources);
    let sources: String = sources
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    let recorded = recorded();
    let mut wanted = BTreeSet::new();
    for path in &dashboards {
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
