//! The documentation stays true: the configuration reference is what the programs define,
//! every config block of the guide loads through its program's loader, every block of the
//! Slurm guide is one tests/guide.rs runs, and every relative link leads to a file.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The fenced blocks of a Markdown text: (info string, text).
fn blocks(markdown: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in markdown.lines() {
        match (line.strip_prefix("```"), open.take()) {
            (Some(_), Some(block)) => out.push(block),
            (Some(info), None) => open = Some((info.trim().to_owned(), String::new())),
            (None, Some((info, mut text))) => {
                text.push_str(line);
                text.push('\n');
                open = Some((info, text));
            }
            (None, None) => {}
        }
    }
    out
}

#[test]
fn the_configuration_reference_is_generated_from_the_programs() {
    let path = repo().join("docs/reference/configuration.md");
    let generated = ceems::cmd::assets::configuration_reference();
    if std::env::var_os("CEEMS_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let written = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        written == generated,
        "docs/reference/configuration.md is stale: run `CEEMS_BLESS=1 cargo test --test docs` (or `ceems generate-assets DIR` and copy DIR/configuration.md)"
    );
    // Every option a program has is there, the environment variable of each too.
    for opt in ceems::cmd::exporter::opts().iter().filter(|o| !o.hidden) {
        assert!(written.contains(&format!("`{}`", opt.key)), "{}", opt.key);
    }
    assert!(written.contains("`CEEMS_STATS_SERVER_PROMETHEUS_URL`"));
}

/// Loads `text` as the config file of `program` with its real loader: unknown keys and bad
/// values are errors, as for a site's file.
fn load(program: &str, text: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ceems.toml");
    std::fs::write(&file, text).unwrap();
    let opts = match program {
        "exporter" => ceems::cmd::exporter::opts(),
        "stats-server" => ceems::cmd::stats_server::opts(),
        "lb" => ceems::cmd::lb::opts(),
        other => panic!("no program {other}"),
    };
    let matches = ceems::cmd::cli()
        .try_get_matches_from([
            "ceems",
            program,
            &format!("--config.file={}", file.display()),
        ])
        .map_err(|e| e.to_string())?;
    let (_, m) = matches.subcommand().unwrap();
    let settings = ceems::config::load(program, &opts, m).map_err(|e| e.to_string())?;
    if program == "stats-server" {
        ceems::cmd::stats_server::cluster_entries(&settings).map_err(|e| e.to_string())?;
        if let Some(policies) = settings.table.get("policies") {
            ceems::policy::config::parse(policies.clone())?;
        }
        if let Some(rules) = settings.table.get("finding-rules") {
            ceems::store::rules::SiteRules::parse(rules.clone(), None)
                .map_err(|e| e.to_string())?;
        }
        if let Some(campaigns) = settings.table.get("campaigns") {
            ceems::notify::campaign::parse(campaigns.clone())?;
        }
    }
    Ok(())
}

#[test]
fn every_config_block_of_the_guide_loads_and_every_slurm_block_is_run() {
    let guide = repo().join("docs/guide");
    let mut checked = 0;
    for entry in std::fs::read_dir(&guide).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        for (info, body) in blocks(&text) {
            let words: Vec<&str> = info.split_whitespace().collect();
            if name == "slurm.md" {
                // tests/guide.rs runs these: a file it writes, or a command.
                let runnable = words.iter().any(|w| w.starts_with("file="))
                    || words == ["sh", "package"]
                    || (words.first() == Some(&"sh")
                        && words[1..].iter().all(|w| w.starts_with("as=")));
                assert!(
                    runnable,
                    "{name}: a block tests/guide.rs does not run: {info}"
                );
                if words.first() == Some(&"toml") {
                    let program = if body.contains("[exporter") {
                        "exporter"
                    } else if body.contains("[stats-server") {
                        "stats-server"
                    } else {
                        "lb"
                    };
                    load(program, &body).unwrap_or_else(|e| panic!("{name}: {e}\n{body}"));
                }
                continue;
            }
            let program = words
                .iter()
                .find_map(|w| w.strip_prefix("program="))
                .unwrap_or_else(|| panic!("{name}: a block without program=: {info}"));
            assert_eq!(words.first(), Some(&"toml"), "{name}: {info}");
            load(program, &body).unwrap_or_else(|e| panic!("{name}: {e}\n{body}"));
            checked += 1;
        }
    }
    assert!(
        checked >= 4,
        "only {checked} config blocks outside the Slurm guide"
    );
    // A mistyped key is caught, so the loads above mean something.
    let bad = load("lb", "[lb.lb]\nbackendz = [\"a=http://x\"]\n").unwrap_err();
    assert!(bad.contains("did you mean `lb.backends`"), "{bad}");
}

/// Relative links of a Markdown file: `[text](target)` whose target is not a URL or anchor.
fn links(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = markdown;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap_or("");
        if !target.is_empty() && !target.contains("://") && !target.contains(' ') {
            out.push(target.to_owned());
        }
    }
    out
}

#[test]
fn every_relative_link_of_the_docs_leads_to_a_file() {
    let mut files = vec![repo().join("README.md")];
    let mut dirs = vec![repo().join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|e| e == "md") {
                files.push(p);
            }
        }
    }
    let mut seen = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for link in links(&text) {
            let target = file.parent().unwrap_or(Path::new(".")).join(&link);
            assert!(
                target.exists(),
                "{}: link to {link}, which does not exist",
                file.display()
            );
            seen += 1;
        }
    }
    assert!(seen > 10, "only {seen} links checked");
}

/// A command line of the docs as the program's parser and config loader take it: its
/// program (a CEEMS name or `ceems <sub>`), flags that exist, values of the right type, and
/// the config file it names (written by the block's heredoc) loaded. `files` maps the paths
/// the block wrote to where they are here.
fn check_command(line: &str, files: &[(String, PathBuf)]) -> Result<(), String> {
    let mut words: Vec<String> = line
        .split_whitespace()
        .map(|w| w.replace(['"', '\''], ""))
        .collect();
    for w in &mut words {
        for (path, here) in files {
            *w = w.replace(path.as_str(), &here.display().to_string());
        }
    }
    let sub = match words.first().map(String::as_str) {
        Some("ceems") => words.get(1).cloned().unwrap_or_default(),
        Some("ceems_exporter") => "exporter".into(),
        Some("ceems_api_server") => "stats-server".into(),
        Some("ceems_lb") => "lb".into(),
        Some("redfish_proxy") => "redfish-proxy".into(),
        _ => return Ok(()),
    };
    let args: Vec<String> = match words[0].as_str() {
        "ceems" => words.clone(),
        _ => ["ceems".to_owned(), sub.clone()]
            .into_iter()
            .chain(words[1..].iter().cloned())
            .collect(),
    };
    let matches = ceems::cmd::cli()
        .try_get_matches_from(&args)
        .map_err(|e| format!("{line}: {e}"))?;
    let (_, m) = matches.subcommand().unwrap();
    let opts = match sub.as_str() {
        "exporter" => ceems::cmd::exporter::opts(),
        "stats-server" => ceems::cmd::stats_server::opts(),
        "lb" => ceems::cmd::lb::opts(),
        "redfish-proxy" => ceems::cmd::redfish_proxy::opts(),
        _ => return Ok(()),
    };
    ceems::config::load(&sub, &opts, m).map_err(|e| format!("{line}: {e}"))?;
    Ok(())
}

#[test]
fn every_command_and_config_of_the_reference_is_one_the_programs_take() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = vec![repo().join("docs/README.md")];
    for sub in ["docs", "docs/reference"] {
        for entry in std::fs::read_dir(repo().join(sub)).unwrap() {
            let p = entry.unwrap().path();
            if p.extension().is_some_and(|e| e == "md") {
                files.push(p);
            }
        }
    }
    let mut commands = 0;
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (info, body) in blocks(&text) {
            let lang = info.split_whitespace().next().unwrap_or("");
            match lang {
                "yaml" => {
                    serde_norway::from_str::<serde_norway::Value>(&body)
                        .unwrap_or_else(|e| panic!("{}: {e}\n{body}", file.display()));
                }
                "toml" => {
                    toml::from_str::<toml::Table>(&body)
                        .unwrap_or_else(|e| panic!("{}: {e}\n{body}", file.display()));
                }
                // Sample output; a `$ ` line in it is a command as typed.
                "" | "sh" => {
                    let joined = body.replace("\\\n", " ");
                    let mut written: Vec<(String, PathBuf)> = Vec::new();
                    let mut lines = joined.lines();
                    while let Some(line) = lines.next() {
                        let line = match lang {
                            "sh" => line,
                            _ => match line.strip_prefix("$ ") {
                                Some(typed) => typed,
                                None => continue,
                            },
                        };
                        // `cat > PATH <<'TAG'`: the file the next lines hold.
                        if let Some((path, tag)) = line
                            .strip_prefix("cat > ")
                            .and_then(|rest| rest.split_once(" <<"))
                        {
                            let tag = tag.trim_matches(['\'', '"', ' ']);
                            let content: Vec<&str> =
                                lines.by_ref().take_while(|l| *l != tag).collect();
                            let name = Path::new(path.trim()).file_name().unwrap();
                            let here = dir.path().join(format!(
                                "{}-{}",
                                written.len(),
                                name.to_string_lossy()
                            ));
                            std::fs::write(&here, content.join("\n") + "\n").unwrap();
                            written.push((path.trim().to_owned(), here));
                            continue;
                        }
                        check_command(line, &written)
                            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                        if line.starts_with("ceems") || line.starts_with("redfish_proxy") {
                            commands += 1;
                        }
                    }
                }
                other => panic!("{}: a `{other}` block no test checks", file.display()),
            }
        }
    }
    assert!(commands >= 6, "only {commands} command lines checked");
}
