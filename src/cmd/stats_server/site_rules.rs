//! The site's own findings (`[[stats-server.finding-rules]]`): loaded at start (a broken rule
//! stops it), reloaded on SIGHUP (a broken rule is logged and the rules in force stay), and
//! run again over stored jobs on an admin's request.

use std::sync::RwLock;

use super::*;
use crate::store::rules::{current, SharedRules, SiteRules};

/// Where an admin asks for stored jobs to be judged again (POST).
pub(super) const RERUN_PATH: &str = "/api/v1/findings/rerun/admin";

pub(super) fn opts() -> Vec<Opt> {
    vec![Opt::new(
        "finding-rules",
        Kind::FileOnly,
        "Findings the site writes: a CEL condition over a job's summary, a severity, a message and advice; reloaded on SIGHUP; see docs/guide/finding-rules.md",
    )]
}

/// The rules of `table` (the stats-server's settings), compiled.
fn parse(table: &toml::Table, file: Option<&std::path::Path>) -> anyhow::Result<SiteRules> {
    match table.get("finding-rules") {
        None => Ok(SiteRules::default()),
        Some(value) => Ok(SiteRules::parse(value.clone(), file)?),
    }
}

/// The thresholds of the built-in findings and the site's rules of the config file; a rule
/// that does not compile stops the start.
pub(super) fn load(settings: &Layered) -> anyhow::Result<(Thresholds, SharedRules)> {
    let thresholds: Thresholds = match settings.table.contains_key("findings") {
        true => settings.get("findings")?,
        false => Thresholds::default(),
    };
    let rules = parse(&settings.table, settings.file.as_deref())
        .context("[[stats-server.finding-rules]]")?;
    if !rules.is_empty() {
        tracing::info!(rules = rules.len(), "site rules of the findings loaded");
    }
    Ok((thresholds, Arc::new(RwLock::new(Arc::new(rules)))))
}

/// On each SIGHUP, the rules are read again from the config file. Only the rules change: the
/// other settings need a restart. A file that does not read or a rule that does not compile
/// is logged with its line and the rules in force stay.
pub(super) async fn reload_on_sighup(rules: SharedRules, file: Option<PathBuf>) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch SIGHUP: the site rules will not be reloaded");
            return;
        }
    };
    while hangup.recv().await.is_some() {
        let Some(file) = &file else {
            tracing::warn!("SIGHUP: no config file (--config.file) to reload the site rules from");
            continue;
        };
        let loaded = config::read_file(file, "stats-server")
            .map_err(anyhow::Error::from)
            .and_then(|table| parse(&table, Some(file)));
        match loaded {
            Ok(new) => {
                tracing::info!(file = %file.display(), rules = new.len(), "SIGHUP: site rules reloaded; `ceems tool findings --rerun` judges stored jobs with them");
                match rules.write() {
                    Ok(mut r) => *r = Arc::new(new),
                    Err(poisoned) => *poisoned.into_inner() = Arc::new(new),
                }
            }
            Err(e) => tracing::error!(
                file = %file.display(),
                error = %format!("{e:#}"),
                kept = current(&rules).len(),
                "SIGHUP: site rules not reloaded; the rules in force stay"
            ),
        }
    }
}

/// Answers an admin's `POST` of [`RERUN_PATH`]: the stored jobs judged again with the rules in
/// force.
pub(super) async fn rerun(
    req: &hyper::Request<hyper::body::Incoming>,
    api: &Api,
    sources: &[Source],
    (thresholds, rules): (&Thresholds, &SharedRules),
) -> hyper::Response<web::Body> {
    let user = req
        .headers()
        .get(api.user_header.as_str())
        .and_then(|v| v.to_str().ok());
    let clusters: Vec<String> = sources.iter().map(|s| s.cluster.id.clone()).collect();
    let rules = current(rules);
    let answer = api
        .rerun_findings(
            req.uri().query(),
            user,
            (thresholds, &rules),
            &clusters,
            unix_now(),
        )
        .await;
    let mut resp = web::encoded_response(answer.body, None, "application/json");
    *resp.status_mut() = answer.status;
    resp
}
