//! cacct's TSDB queries (`tsdb.queries` of its config). CEEMS v0.16 writes them as a list of
//! `{name, title, help, query, kind}`, the query a Go template over `{{.UUIDs}}` (the jobs'
//! ids, `a|b|c`) and `{{.Range}}` (a job's duration, for instant queries); `kind: range`
//! queries are saved as series (`--ts.metrics`), `kind: instant` ones are table columns.
//! v0.10's map form (`name: query` with `%s` for the ids) still loads, as range queries.

use serde_norway::Value;

/// How a query is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Over each job's life: its series are saved (`--ts.metrics`).
    Range,
    /// Once per job: its value is a table column.
    Instant,
}

/// One query of the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeriesQuery {
    /// The name `--format` and `--ts.metrics` take: the config's name camel-cased.
    pub key: String,
    pub title: String,
    pub help: String,
    template: String,
    pub kind: Kind,
}

/// CEEMS's camel case of a query's name: `avg_-usage-something_Vector` → `avgUsageSomethingVector`.
pub fn camel_case(name: &str) -> String {
    let mut out = String::new();
    for part in name.split(['_', '-', ' ']).filter(|p| !p.is_empty()) {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            match out.is_empty() {
                true => out.extend(first.to_lowercase()),
                false => out.extend(first.to_uppercase()),
            }
            out.push_str(chars.as_str());
        }
    }
    out
}

impl SeriesQuery {
    /// The PromQL of this query for `uuids`, over `range_seconds` (instant queries).
    pub fn promql(&self, uuids: &[&str], range_seconds: i64) -> String {
        self.template
            .replace("{{.UUIDs}}", &uuids.join("|"))
            .replace("{{.Range}}", &format!("{}s", range_seconds.max(1)))
    }
}

/// The queries of a YAML text holding only `tsdb.queries`'s value.
pub fn parse_yaml(text: &str) -> Result<(Vec<SeriesQuery>, bool), String> {
    let value: Value = serde_norway::from_str(text).map_err(|e| e.to_string())?;
    parse(&value)
}

/// The queries of `tsdb.queries`, in either form; whether it was the old (map) form.
pub fn parse(value: &Value) -> Result<(Vec<SeriesQuery>, bool), String> {
    match value {
        Value::Null => Ok((Vec::new(), false)),
        // v0.10: `name: query`, `%s` where the ids go.
        Value::Mapping(map) => {
            let mut out = Vec::new();
            for (name, query) in map {
                let (Some(name), Some(query)) = (name.as_str(), query.as_str()) else {
                    return Err("tsdb.queries: each name and query must be text".into());
                };
                out.push(SeriesQuery {
                    key: name.to_owned(),
                    title: name.to_owned(),
                    help: String::new(),
                    template: query.replacen("%s", "{{.UUIDs}}", 1),
                    kind: Kind::Range,
                });
            }
            Ok((out, true))
        }
        Value::Sequence(list) => {
            let mut out: Vec<SeriesQuery> = Vec::new();
            for (i, entry) in list.iter().enumerate() {
                let at = |key: &str| format!("tsdb.queries[{i}].{key}");
                let Value::Mapping(map) = entry else {
                    return Err(format!(
                        "tsdb.queries[{i}]: expected {{name, title, help, query, kind}}"
                    ));
                };
                let get = |key: &str| -> Result<String, String> {
                    match map.get(key) {
                        None | Some(Value::Null) => Ok(String::new()),
                        Some(Value::String(s)) => Ok(s.clone()),
                        Some(_) => Err(format!("{}: expected text", at(key))),
                    }
                };
                let (name, title, help, query, kind) = (
                    get("name")?,
                    get("title")?,
                    get("help")?,
                    get("query")?,
                    get("kind")?,
                );
                if let Some(other) = map
                    .keys()
                    .filter_map(Value::as_str)
                    .find(|k| !["name", "title", "help", "query", "kind"].contains(k))
                {
                    return Err(format!("{}: unknown key", at(other)));
                }
                if name.is_empty() || query.is_empty() {
                    return Err(format!("tsdb.queries[{i}]: name and query are needed"));
                }
                let kind = match kind.as_str() {
                    "" | "range" => Kind::Range,
                    "instant" => Kind::Instant,
                    other => {
                        return Err(format!(
                            "{}: `{other}` is neither range nor instant",
                            at("kind")
                        ))
                    }
                };
                let key = camel_case(&name);
                if out.iter().any(|q| q.key.eq_ignore_ascii_case(&key)) {
                    return Err(format!("tsdb.queries: `{name}` ({key}) is named twice"));
                }
                out.push(SeriesQuery {
                    title: if title.is_empty() {
                        name.clone()
                    } else {
                        title
                    },
                    key,
                    help,
                    template: query,
                    kind,
                });
            }
            Ok((out, false))
        }
        _ => Err("tsdb.queries: expected a list of {name, title, help, query, kind}".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(text: &str) -> Value {
        serde_norway::from_str(text).unwrap()
    }

    #[test]
    fn names_are_camel_cased_as_ceems_does() {
        assert_eq!(camel_case("cpu_usage"), "cpuUsage");
        assert_eq!(
            camel_case("avg_-usage-something_Vector"),
            "avgUsageSomethingVector"
        );
        assert_eq!(
            camel_case("Avg-UsageSomething-Scalar"),
            "avgUsageSomethingScalar"
        );
    }

    #[test]
    fn the_list_form_and_the_old_map_form_load() {
        let (list, old) = parse(&yaml(
            "- name: cpu_usage\n  title: Avg. CPU Usage\n  help: CPU\n  query: avg_cpu_usage{uuid=~`{{.UUIDs}}`}\n  kind: range\n- name: x\n  query: avg_over_time(x{uuid=~\"{{.UUIDs}}\"}[{{.Range}}:])\n  kind: instant\n",
        ))
        .unwrap();
        assert!(!old);
        assert_eq!(list[0].key, "cpuUsage");
        assert_eq!(list[0].title, "Avg. CPU Usage");
        assert_eq!(list[1].kind, Kind::Instant);
        assert_eq!(list[1].title, "x");
        assert_eq!(
            list[1].promql(&["1", "2"], 90),
            "avg_over_time(x{uuid=~\"1|2\"}[90s:])"
        );
        assert_eq!(list[0].promql(&["7"], 0), "avg_cpu_usage{uuid=~`7`}");
        let (map, old) = parse(&yaml("cpu_usage: avg_cpu_usage{uuid=~\"%s\"}\n")).unwrap();
        assert!(old);
        assert_eq!(map[0].key, "cpu_usage");
        assert_eq!(map[0].promql(&["5"], 1), "avg_cpu_usage{uuid=~\"5\"}");
    }

    #[test]
    fn mistakes_are_named() {
        for (text, says) in [
            (
                "- name: a\n  query: q\n- name: A\n  query: r\n",
                "named twice",
            ),
            (
                "- name: a\n  query: q\n  kind: vector\n",
                "neither range nor instant",
            ),
            ("- name: a\n", "name and query"),
            ("- name: a\n  query: q\n  step: 5\n", "tsdb.queries[0].step"),
            ("42\n", "expected a list"),
        ] {
            let e = parse(&yaml(text)).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
