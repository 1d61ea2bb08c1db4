//! The findings pass: the built-in rules and the site's over the jobs of a cluster, a page of
//! rows at a time, stored with each job.

use std::collections::BTreeMap;

use super::{Store, StoreError};
use crate::manager::UnitRecord;
use crate::store::findings::{evaluate, JobFacts, Thresholds};
use crate::store::rules::{Judge, SharedRules, SiteRules};
use crate::store::sql::{Backend, DbRow, Sql};

/// The thresholds and the site's rules (those in force at each batch) that judge the jobs an
/// ingestion inserts: a new row has no aggregates yet, so what the findings pass would find
/// in it is known before it is written, and writing it then spares the pass reading every new
/// row back and writing it again (a first update of a million jobs: most of its time).
#[derive(Clone)]
pub struct InsertJudge {
    pub thresholds: Thresholds,
    pub rules: SharedRules,
}

/// Which jobs a pass judges.
#[derive(Debug, Clone, Copy)]
enum Judged {
    /// Those whose row or aggregates changed since their findings were written.
    Changed,
    /// Those that ended in the window (unix seconds), and the running ones started before
    /// its end.
    Between(i64, i64),
}

impl Store {
    /// Judges the jobs that ingestions insert from now on as they are inserted; a job already
    /// stored that changes is judged by the findings pass, with its aggregates. Set once.
    pub fn judge_inserted_jobs(&self, judge: InsertJudge) {
        let _ = self.insert_judge.set(judge);
    }

    /// The findings (as stored) of `jobs` written as new rows of a cluster of `manager`, in
    /// their order; empty when inserted jobs are not judged.
    pub(super) fn findings_at_insert(
        &self,
        jobs: &[&UnitRecord],
        manager: &str,
    ) -> Vec<Option<String>> {
        match self.insert_judge.get() {
            Some(j) => findings_of_new_jobs(
                jobs,
                manager,
                &j.thresholds,
                &crate::store::rules::current(&j.rules),
            ),
            None => Vec::new(),
        }
    }

    /// Recomputes the findings of the jobs of `cluster` whose row or aggregates changed since
    /// their findings were written. Returns how many jobs were updated.
    pub async fn refresh_findings(
        &self,
        cluster: &str,
        thresholds: &Thresholds,
        rules: &SiteRules,
        now: i64,
    ) -> Result<usize, StoreError> {
        self.judge(cluster, thresholds, rules, Judged::Changed, now)
            .await
    }

    /// Judges again, with the rules in force, the jobs of `cluster` that ended between `from`
    /// and `to` (unix seconds) and those still running that started before `to`, whatever
    /// their findings were: `ceems tool findings --rerun`. Returns how many were judged.
    pub async fn rejudge_findings(
        &self,
        cluster: &str,
        thresholds: &Thresholds,
        rules: &SiteRules,
        (from, to): (i64, i64),
        now: i64,
    ) -> Result<usize, StoreError> {
        self.judge(cluster, thresholds, rules, Judged::Between(from, to), now)
            .await
    }

    async fn judge(
        &self,
        cluster: &str,
        thresholds: &Thresholds,
        rules: &SiteRules,
        which: Judged,
        now: i64,
    ) -> Result<usize, StoreError> {
        // In pages by row id, so a first run over a million jobs holds one page in memory. Of
        // 1000: a page's rows are made on whichever reader's thread, in its malloc arena, and
        // pages of 5000 (12 MB) left up to 35 MB behind in the readers' arenas; as fast.
        const PAGE: i64 = 1000;
        // SQLite would pick the cluster's index over the row ids and sort a million rows per
        // page; the unary plus keeps it on the primary key. PostgreSQL plans this well.
        let cluster_col = match self.backend() {
            Backend::Sqlite => "+cluster_id",
            Backend::Postgres => "cluster_id",
        };
        // The advice is worded for the cluster's manager.
        let manager: String = match self
            .fetch_optional(&Sql::new("SELECT manager FROM clusters WHERE id = $1").arg(cluster))
            .await?
        {
            Some(row) => row.get(0)?,
            None => String::new(),
        };
        let which_sql = match which {
            Judged::Changed => {
                "(findings_updated_at IS NULL
                  OR findings_updated_at < last_updated_at
                  OR findings_updated_at < coalesce(aggregates_updated_at, 0))"
            }
            Judged::Between(..) => {
                "((ended_at >= $4 AND ended_at <= $5) OR (ended_at IS NULL AND started_at <= $5))"
            }
        };
        let page = |after: i64| {
            let q = Sql::new(&format!(
                "SELECT id, state, exit_code, ended_at IS NOT NULL, elapsed_seconds,
                        time_limit_seconds, alloc_cpus, alloc_mem_bytes, alloc_gpus,
                        aggregated_seconds, cpu_seconds, memory_peak_bytes, memory_fail_count,
                        CASE WHEN gpu_utilization_max IS NULL THEN NULL ELSE mean_gpu_utilization END,
                        gpu_utilization_max, host_energy_joules, gpu_energy_joules, emissions_grams,
                        measured, name, usr, project, partition, qos, nodes, node_cpu_seconds,
                        gpu_memory_peak_bytes
                 FROM units
                 WHERE id > $2 AND {cluster_col} = $1 AND started_at > 0 AND {which_sql}
                 ORDER BY id LIMIT $3"
            ))
            .arg(cluster)
            .arg(after)
            .arg(PAGE);
            match which {
                Judged::Changed => q,
                Judged::Between(from, to) => q.arg(from).arg(to),
            }
        };
        let mut total = 0usize;
        let mut jobs = self.job_facts(&page(0), &manager).await?;
        // A page is stored by the writer while a reader fetches the next (pages are disjoint
        // ranges of ids): the two overlap (a million new jobs: 25 s -> 16 s on two cores).
        while let Some(&(after, _)) = jobs.last() {
            let updates = judge_page(&jobs, thresholds, rules, &manager);
            drop(jobs);
            let next = page(after);
            let (stored, next) = tokio::join!(
                self.store_findings(&updates, now),
                self.job_facts(&next, &manager)
            );
            stored?;
            jobs = next?;
            total += updates.len();
        }
        Ok(total)
    }

    /// A page of the findings' query read into the facts the rules judge; sqlx's copy of its
    /// rows (a value per column) is let go at once.
    async fn job_facts(
        &self,
        page: &Sql,
        manager: &str,
    ) -> Result<Vec<(i64, JobFacts)>, StoreError> {
        let rows = self.fetch_all(page).await?;
        let jobs = rows
            .iter()
            .map(|r| job_facts(r, manager))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(jobs)
    }

    /// One page's findings in one statement (row-by-row updates made a first run over a
    /// million jobs take minutes), through the writer: its page cache holds the pages the
    /// rewritten rows split, where a reader's small one spilled them mid-statement.
    async fn store_findings(
        &self,
        updates: &[(i64, Option<String>)],
        now: i64,
    ) -> Result<(), StoreError> {
        let mut q = Sql::new("UPDATE units SET findings = v.column2, findings_updated_at = ");
        q.bind(now).push(" FROM (VALUES ");
        for (i, (id, json)) in updates.iter().enumerate() {
            q.push(if i == 0 { "(" } else { ", (" })
                .bind(*id)
                .push(", ")
                .bind(json.as_deref())
                .push(")");
        }
        q.push(") AS v WHERE units.id = v.column1");
        let mut tx = self.write_tx().await?;
        tx.execute(&q).await?;
        tx.commit().await?;
        let ids: Vec<i64> = updates.iter().map(|(id, _)| *id).collect();
        self.written_units(&ids);
        Ok(())
    }
}

/// The findings of a page of jobs, each job's id with its findings as stored (no finding is
/// NULL, read back as `[]`). The site's rules are made for the page and gone before the next
/// await (CEL's context is not Send).
fn judge_page(
    jobs: &[(i64, JobFacts)],
    thresholds: &Thresholds,
    rules: &SiteRules,
    manager: &str,
) -> Vec<(i64, Option<String>)> {
    let judge = rules.judge(manager);
    jobs.iter()
        .map(|(id, facts)| (*id, findings_json(facts, thresholds, &judge)))
        .collect()
}

/// A job's findings as stored: the built-in rules' and the site's, the gravest first; NULL
/// (None) for none.
fn findings_json(facts: &JobFacts, thresholds: &Thresholds, judge: &Judge) -> Option<String> {
    let mut found = evaluate(facts, thresholds);
    found.extend(judge.evaluate(facts));
    found.sort_by_key(|f| std::cmp::Reverse(f.severity));
    (!found.is_empty())
        .then(|| serde_json::to_string(&found).ok())
        .flatten()
}

/// What the findings pass would store for each of `jobs` once inserted, before any aggregate:
/// the facts [`job_facts`] reads from such a row. A pending job (no start) is not judged.
pub fn findings_of_new_jobs(
    jobs: &[&UnitRecord],
    manager: &str,
    thresholds: &Thresholds,
    rules: &SiteRules,
) -> Vec<Option<String>> {
    let judge = rules.judge(manager);
    jobs.iter()
        .map(|j| {
            if j.start.unwrap_or(0) <= 0 {
                return None;
            }
            findings_json(&new_row_facts(j, manager), thresholds, &judge)
        })
        .collect()
}

/// The facts of a job's row as inserted: its record's, and no aggregate (the columns'
/// defaults).
fn new_row_facts(j: &UnitRecord, manager: &str) -> JobFacts {
    let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    JobFacts {
        manager: manager.to_string(),
        name: j.name.clone(),
        user: j.user.clone(),
        project: j.account.clone(),
        partition: j.partition.clone(),
        qos: j.qos.clone(),
        nodes: j.nodes.join(","),
        state: j.state.clone(),
        exit_code: j.exit_code.clone(),
        ended: j.end.is_some(),
        elapsed_seconds: int(j.elapsed_seconds),
        time_limit_seconds: j.time_limit_seconds.map(int),
        alloc_cpus: int(j.allocation.cpus),
        alloc_mem_bytes: int(j.allocation.mem_bytes),
        alloc_gpus: int(j.allocation.gpus),
        ..JobFacts::default()
    }
}

/// A row of the findings' query as the rules read it.
fn job_facts(r: &DbRow, manager: &str) -> Result<(i64, JobFacts), StoreError> {
    let facts = JobFacts {
        manager: manager.to_string(),
        state: r.get(1)?,
        exit_code: r.get(2)?,
        ended: r.flag(3)?,
        elapsed_seconds: r.get(4)?,
        time_limit_seconds: r.get(5)?,
        alloc_cpus: r.get(6)?,
        alloc_mem_bytes: r.get(7)?,
        alloc_gpus: r.get(8)?,
        aggregated_seconds: r.get(9)?,
        cpu_seconds: r.get(10)?,
        memory_peak_bytes: r.get(11)?,
        memory_fail_count: r.get(12)?,
        mean_gpu_utilization: r.get(13)?,
        gpu_utilization_max: r.get(14)?,
        host_energy_joules: r.get(15)?,
        gpu_energy_joules: r.get(16)?,
        emissions_grams: r.get(17)?,
        measured: r.get(18)?,
        name: r.get(19)?,
        user: r.get(20)?,
        project: r.get(21)?,
        partition: r.get(22)?,
        qos: r.get(23)?,
        nodes: r.get(24)?,
        node_cpu_seconds: r
            .get::<Option<String>>(25)?
            .and_then(|j| serde_json::from_str::<BTreeMap<String, f64>>(&j).ok())
            .map(|m| m.into_iter().collect())
            .unwrap_or_default(),
        gpu_memory_peak_bytes: r.get(26)?,
    };
    Ok((r.get(0)?, facts))
}
