//! The layout rules a newcomer relies on (README, "Layout"): files small enough to read, and
//! layers that import only downwards, so a request can be followed from file to file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Most lines of code a source file may have before its tests.
const MAX_CODE_LINES: usize = 650;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn src_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    files.sort();
    assert!(files.len() > 50, "found only {} files", files.len());
    files
}

/// The lines of a file before its test module, without blank and comment lines.
fn code_before_tests(text: &str) -> Vec<&str> {
    let mut code = Vec::new();
    let mut in_block_comment = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with("#[cfg(test)]") {
            break;
        }
        if in_block_comment {
            in_block_comment = !line.contains("*/");
            continue;
        }
        if line.starts_with("/*") {
            in_block_comment = !line.contains("*/");
            continue;
        }
        if !line.is_empty() && !line.starts_with("//") {
            code.push(line);
        }
    }
    code
}

/// A test file (`tests.rs`, or one under a `tests/` folder) is all tests.
fn is_test_file(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "tests.rs")
        || path.components().any(|c| c.as_os_str() == "tests")
}

#[test]
fn every_source_file_has_at_most_650_lines_of_code_before_its_tests() {
    let mut too_long = Vec::new();
    for path in src_files().iter().filter(|p| !is_test_file(p)) {
        let text = std::fs::read_to_string(path).unwrap();
        let n = code_before_tests(&text).len();
        if n > MAX_CODE_LINES {
            too_long.push(format!("{}: {n}", path.display()));
        }
    }
    assert!(too_long.is_empty(), "split these files: {too_long:?}");
}

#[test]
fn the_line_counter_skips_comments_blank_lines_and_tests() {
    let text =
        "//! doc\n\nuse a;\n/* block\n still */\nfn f() {}\n// note\n#[cfg(test)]\nmod tests {}\n";
    assert_eq!(code_before_tests(text), ["use a;", "fn f() {}"]);
}

/// The top-level module a path of `src/` belongs to (`lib.rs` and `main.rs` belong to none).
fn top_module(src: &Path, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_owned())
}

/// Which top-level modules each one's code (not its tests) names through `crate::`.
fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in src_files().iter().filter(|p| !is_test_file(p)) {
        let Some(from) = top_module(&src, path) else {
            continue;
        };
        let text = std::fs::read_to_string(path).unwrap();
        let edges = graph.entry(from.clone()).or_default();
        for line in code_before_tests(&text) {
            for (i, _) in line.match_indices("crate::") {
                let to: String = line[i + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !to.is_empty() && to != from {
                    edges.insert(to);
                }
            }
        }
    }
    graph
}

/// A circle through `node`, if the graph has one reachable from it.
fn find_circle(
    graph: &BTreeMap<String, BTreeSet<String>>,
    node: &str,
    path: &mut Vec<String>,
    done: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    if let Some(at) = path.iter().position(|n| n == node) {
        let mut circle = path[at..].to_vec();
        circle.push(node.to_owned());
        return Some(circle);
    }
    if done.contains(node) {
        return None;
    }
    path.push(node.to_owned());
    for next in graph.get(node).into_iter().flatten() {
        if let Some(c) = find_circle(graph, next, path, done) {
            return Some(c);
        }
    }
    path.pop();
    done.insert(node.to_owned());
    None
}

#[test]
fn the_top_level_modules_import_each_other_without_a_circle() {
    let graph = import_graph();
    for must in ["host", "collect", "manager", "registry", "store", "cmd"] {
        assert!(graph.contains_key(must), "no module {must}: {graph:?}");
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(circle) = find_circle(&graph, node, &mut Vec::new(), &mut done) {
            panic!("import circle: {}", circle.join(" -> "));
        }
    }
    // The layers' own rules, in their module comments.
    assert!(graph["host"].is_empty(), "host imports {:?}", graph["host"]);
    assert!(
        graph["registry"].contains("manager") && graph["registry"].contains("collect"),
        "the registry lists both: {:?}",
        graph["registry"]
    );
}

#[test]
fn the_circle_finder_finds_a_circle() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    graph.entry("a".into()).or_default().insert("b".into());
    graph.entry("b".into()).or_default().insert("a".into());
    let circle = find_circle(&graph, "a", &mut Vec::new(), &mut BTreeSet::new());
    assert_eq!(circle.unwrap(), ["a", "b", "a"]);
}

#[test]
fn collectors_name_no_resource_manager() {
    let collect = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/collect");
    let mut found = Vec::new();
    for path in src_files().iter().filter(|p| p.starts_with(&collect)) {
        let text = std::fs::read_to_string(path).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.contains("crate::manager") {
                found.push(format!("{}:{}", path.display(), n + 1));
            }
        }
    }
    assert!(found.is_empty(), "collect/ imports manager/: {found:?}");
}

/// The policies act through a cluster's `Accounting` and know no manager by name.
#[test]
fn policies_name_no_resource_manager() {
    let policy = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/policy");
    let managers = ["slurm", "lsf", "k8s", "openpbs", "libvirt", "openstack"];
    let mut found = Vec::new();
    let files: Vec<PathBuf> = src_files()
        .into_iter()
        .filter(|p| p.starts_with(&policy) && !is_test_file(p))
        .collect();
    assert!(files.len() >= 5, "{files:?}");
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for line in code_before_tests(&text) {
            if managers.iter().any(|m| {
                line.contains(&format!("manager::{m}")) || line.contains(&format!("\"{m}\""))
            }) {
                found.push(format!("{}: {line}", path.display()));
            }
        }
    }
    assert!(found.is_empty(), "policy/ names a manager: {found:?}");
}
