//! The CPU time of each node of an ended multi-node job, summed per node by Prometheus (the
//! data stays where it is: one small answer per job), so that a node that did nothing shows
//! in the findings (`idle_nodes`).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::aggregate::{ask, render, AggregateError};
use super::db::Store;
use super::prometheus::Prometheus;

/// Jobs asked per run: the rest wait for the next.
const JOBS_PER_RUN: i64 = 200;

/// Seconds added before the start and after the end of a job's life, so the counter's first
/// and last samples are inside the range.
const MARGIN: i64 = 60;

/// Asks Prometheus for the per-node CPU seconds of `cluster`'s multi-node jobs that are due
/// and stores them. `template` is `node-cpu-seconds` (empty: off). Returns how many jobs got
/// their figures; a job whose query fails is asked again at the next run.
pub async fn update(
    store: &Store,
    prometheus: Arc<dyn Prometheus>,
    template: &str,
    cluster: &str,
    now: i64,
) -> Result<usize, AggregateError> {
    if template.is_empty() {
        return Ok(0);
    }
    let due = store.multi_node_jobs_due(cluster, JOBS_PER_RUN).await?;
    let mut figures = Vec::with_capacity(due.len());
    for job in due {
        let at = (job.ended_at + MARGIN).min(now);
        let range = at - job.started_at + MARGIN;
        let promql = render(template, &[job.uuid.as_str()], range);
        match ask(Arc::clone(&prometheus), promql, at).await {
            Ok(answer) => figures.push((job.row, per_node(&job.uuid, &answer))),
            Err(e) => {
                tracing::debug!(cluster, job = %job.uuid, error = %e, "per-node CPU time not asked; next run");
            }
        }
    }
    store.set_node_cpu_seconds(&figures).await?;
    Ok(figures.len())
}

/// The answer's `job/hostname/cgrouphostname/instance` series as a JSON object of CPU seconds
/// by node: the cgroup's host where slurmd runs several nodes per host, else the exporter's
/// host, else (an exporter without hostname labels) the scrape target's host.
pub fn per_node(uuid: &str, answer: &[(String, f64)]) -> String {
    let mut nodes: BTreeMap<&str, f64> = BTreeMap::new();
    for (label, seconds) in answer {
        let mut parts = label.splitn(4, '/');
        let (Some(job), host, cgroup_host, instance) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        // `host:port`, or `[v6]:port`: the host.
        let target = instance.map(|i| match i.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => {
                h.trim_start_matches('[').trim_end_matches(']')
            }
            _ => i,
        });
        let node = match (cgroup_host, host, target) {
            (Some(c), _, _) if !c.is_empty() => c,
            (_, Some(h), _) if !h.is_empty() => h,
            (_, _, Some(t)) if !t.is_empty() => t,
            _ => continue,
        };
        if job == uuid && seconds.is_finite() {
            *nodes.entry(node).or_default() += seconds.max(0.0);
        }
    }
    serde_json::to_string(&nodes).unwrap_or_else(|_| "{}".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_summed_by_node_and_other_jobs_or_unlabelled_ones_are_left_out() {
        let answer = vec![
            ("7/n1//n1:9010".to_owned(), 100.0),
            ("7/n2//n2:9010".to_owned(), 0.5),
            ("7/vm/node3/vm:9010".to_owned(), 3.0),
            ("7/vm/node3/vm:9010".to_owned(), 1.0),
            ("7///n5.example.org:9010".to_owned(), 2.0),
            ("7///[fd00::6]:9010".to_owned(), 2.5),
            ("8/n1//n1:9010".to_owned(), 9.0),
            ("7///".to_owned(), 9.0),
            ("7".to_owned(), 9.0),
            ("7/n4//n4:9010".to_owned(), f64::NAN),
        ];
        assert_eq!(
            per_node("7", &answer),
            r#"{"fd00::6":2.5,"n1":100.0,"n2":0.5,"n5.example.org":2.0,"node3":4.0}"#
        );
        assert_eq!(per_node("7", &[]), "{}");
    }
}
