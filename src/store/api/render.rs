//! A job's row as `/units` answers it: CEEMS's `Unit` (times as text in a time zone and in
//! milliseconds, `allocation`, `total_time_seconds`, one object per series, `tags`), then the
//! fields of ours a request names.
//!
//! CEEMS leaves out what is empty (Go's `omitempty`): a job not yet aggregated has no series
//! objects, a running job no `ended_at_ts`, an empty string is not written.

use jiff::tz::TimeZone;

use super::*;

/// The columns `UnitRow::read` reads, in its order.
pub(super) const UNIT_COLUMNS: &str = "id, cluster_id,
    (SELECT c.manager FROM clusters c WHERE c.id = units.cluster_id), uuid, name, project, grp,
    usr, submitted_at, started_at, ended_at, elapsed_seconds, state, alloc_cpus,
    alloc_mem_bytes, alloc_gpus, billing, nodes, partition, qos, gid, uid, exit_code, workdir,
    cpu_seconds, aggregated_seconds, mean_memory_bytes, mean_gpu_utilization,
    cpu_energy_joules, host_energy_joules, gpu_energy_joules, emissions_grams, io_read_bytes,
    io_write_bytes, aggregates_status, aggregates_updated_at, last_updated_at,
    time_limit_seconds, memory_peak_bytes, coalesce(findings, '[]'), series, reported, measured";

/// One job, as stored.
pub(super) struct UnitRow {
    pub(super) id: i64,
    cluster_id: String,
    manager: Option<String>,
    uuid: String,
    name: String,
    project: String,
    group: String,
    user: String,
    submitted_at: Option<i64>,
    started_at: i64,
    ended_at: Option<i64>,
    elapsed_seconds: i64,
    state: String,
    alloc_cpus: i64,
    alloc_mem_bytes: i64,
    alloc_gpus: i64,
    billing: i64,
    nodes: String,
    partition: String,
    qos: String,
    gid: Option<i64>,
    uid: Option<i64>,
    exit_code: String,
    workdir: String,
    cpu_seconds: f64,
    aggregated_seconds: i64,
    mean_memory_bytes: f64,
    mean_gpu_utilization: f64,
    cpu_energy_joules: f64,
    host_energy_joules: f64,
    gpu_energy_joules: f64,
    emissions_grams: f64,
    io_read_bytes: f64,
    io_write_bytes: f64,
    aggregates_status: String,
    aggregates_updated_at: Option<i64>,
    last_updated_at: i64,
    time_limit_seconds: Option<i64>,
    memory_peak_bytes: Option<f64>,
    findings: String,
    /// What the policies did to the job, when the request asks (`field=actions`).
    pub(super) actions: Option<Value>,
    /// Values of CEEMS's series queries; when there are any, the series objects are these.
    series: Map<String, Value>,
    /// What the manager said in its own words; where it did, CEEMS's fields say the same.
    reported: crate::manager::Reported,
    /// The `measured` bits: which figures Prometheus ever gave.
    measured: i64,
}

/// The series objects of a job or a usage row, in CEEMS's order.
pub(super) const SERIES: &[&str] = UNIT_FIELDS.split_at(17).1.split_at(16).0;

/// Writes the series `name` of CEEMS's queries, rounded as CEEMS writes numbers, when it has
/// values.
pub(super) fn stored_series(out: &mut JsonObject, series: &Map<String, Value>, name: &str) {
    if let Some(Value::Object(subs)) = series.get(name) {
        if !subs.is_empty() {
            let rounded: Map<String, Value> = subs
                .iter()
                .map(|(k, v)| (k.clone(), v.as_f64().map_or(Value::Null, number)))
                .collect();
            out.value(name, Value::Object(rounded));
        }
    }
}

impl UnitRow {
    pub(super) fn read(r: &DbRow) -> Result<UnitRow, sqlx::Error> {
        Ok(UnitRow {
            id: r.get(0)?,
            cluster_id: r.get(1)?,
            manager: r.get(2)?,
            uuid: r.get(3)?,
            name: r.get(4)?,
            project: r.get(5)?,
            group: r.get(6)?,
            user: r.get(7)?,
            submitted_at: r.get(8)?,
            started_at: r.get(9)?,
            ended_at: r.get(10)?,
            elapsed_seconds: r.get(11)?,
            state: r.get(12)?,
            alloc_cpus: r.get(13)?,
            alloc_mem_bytes: r.get(14)?,
            alloc_gpus: r.get(15)?,
            billing: r.get(16)?,
            nodes: r.get(17)?,
            partition: r.get(18)?,
            qos: r.get(19)?,
            gid: r.get(20)?,
            uid: r.get(21)?,
            exit_code: r.get(22)?,
            workdir: r.get(23)?,
            cpu_seconds: r.get(24)?,
            aggregated_seconds: r.get(25)?,
            mean_memory_bytes: r.get(26)?,
            mean_gpu_utilization: r.get(27)?,
            cpu_energy_joules: r.get(28)?,
            host_energy_joules: r.get(29)?,
            gpu_energy_joules: r.get(30)?,
            emissions_grams: r.get(31)?,
            io_read_bytes: r.get(32)?,
            io_write_bytes: r.get(33)?,
            aggregates_status: r.get(34)?,
            aggregates_updated_at: r.get(35)?,
            last_updated_at: r.get(36)?,
            time_limit_seconds: r.get(37)?,
            memory_peak_bytes: r.get(38)?,
            findings: r.get(39)?,
            actions: None,
            series: serde_json::from_str(&r.get::<String>(40)?).unwrap_or_default(),
            reported: serde_json::from_str(&r.get::<String>(41)?).unwrap_or_default(),
            measured: r.get(42)?,
        })
    }

    fn has(&self, figure: i64) -> bool {
        measured::has(self.measured, figure)
    }

    fn measured_or_null(&self, figure: i64, v: f64) -> Value {
        match self.has(figure) {
            true => number(v),
            false => Value::Null,
        }
    }

    /// The job as a JSON object of `fields`, its times in `tz`. `emissions_key` names the
    /// emissions' provider (`owid_total`).
    pub(super) fn render(&self, fields: FieldSet, tz: &TimeZone, emissions_key: &str) -> String {
        let mut out = JsonObject::default();
        for (i, name) in UNIT_FIELDS.iter().enumerate() {
            if fields.0 & (1 << i) != 0 {
                self.field(name, tz, emissions_key, &mut out);
            }
        }
        out.finish()
    }

    /// A made-up job, the `i`th of a demo answer.
    pub(super) fn demo(i: i64) -> UnitRow {
        let start = 1_700_000_000 + i * 3600;
        UnitRow {
            id: i,
            cluster_id: "demo-0".into(),
            manager: Some("slurm".into()),
            uuid: (1000 + i).to_string(),
            name: format!("demo-job-{i}"),
            project: format!("project{}", i % 3),
            group: format!("group{}", i % 4),
            user: format!("user{}", i % 4),
            submitted_at: Some(start - 60),
            started_at: start,
            ended_at: Some(start + 1800 + 60 * i),
            elapsed_seconds: 1800 + 60 * i,
            state: "COMPLETED".into(),
            alloc_cpus: 4 << (i % 3),
            alloc_mem_bytes: 8 << 30,
            alloc_gpus: i % 2,
            billing: 4 << (i % 3),
            nodes: format!("node{i:02}"),
            partition: "cpu".into(),
            qos: "normal".into(),
            gid: Some(1000 + i % 4),
            uid: Some(1000 + i % 4),
            exit_code: "0:0".into(),
            workdir: format!("/home/user{}", i % 4),
            cpu_seconds: 1000.0 * (1 + i) as f64,
            aggregated_seconds: 1800 + 60 * i,
            mean_memory_bytes: 2e9,
            mean_gpu_utilization: 0.4,
            cpu_energy_joules: 2e5,
            host_energy_joules: 4e5,
            gpu_energy_joules: 3e5 * (i % 2) as f64,
            emissions_grams: 12.5,
            io_read_bytes: 1e9,
            io_write_bytes: 2e8,
            aggregates_status: "done".into(),
            aggregates_updated_at: Some(start + 3600),
            last_updated_at: start + 3600,
            time_limit_seconds: Some(7200),
            memory_peak_bytes: Some(4e9),
            findings: "[]".into(),
            actions: None,
            series: Map::new(),
            reported: Default::default(),
            measured: 31,
        }
    }

    fn aggregated(&self) -> bool {
        self.aggregated_seconds > 0
    }

    fn field(&self, name: &str, tz: &TimeZone, emissions_key: &str, out: &mut JsonObject) {
        let started = (self.started_at > 0).then_some(self.started_at);
        let gpus = self.alloc_gpus > 0;
        let agg = self.aggregated();
        if !self.series.is_empty() && SERIES.contains(&name) {
            return stored_series(out, &self.series, name);
        }
        match name {
            "cluster_id" => out.text(name, &self.cluster_id),
            "resource_manager" => out.text(name, self.manager.as_deref().unwrap_or("")),
            // CEEMS writes the uuid even when empty.
            "uuid" => out.value(name, Value::from(self.uuid.as_str())),
            // CEEMS 0.14+ gives an LSF job no name.
            "name" if self.manager.as_deref() == Some("lsf") => {}
            "name" => out.text(name, &self.name),
            "project" => out.text(name, &self.project),
            "groupname" => out.text(name, &self.group),
            "username" => out.text(name, &self.user),
            "created_at" => out.text(name, &local_time(self.submitted_at, tz)),
            "started_at" => out.text(name, &local_time(started, tz)),
            "ended_at" => match self.ended_at {
                Some(_) => out.text(name, &local_time(self.ended_at, tz)),
                // What sacct says of a job that has not ended; CEEMS's other managers say N/A.
                None if self.manager.as_deref() == Some("slurm") => out.text(name, "Unknown"),
                None => out.text(name, "N/A"),
            },
            "created_at_ts" => out.millis(name, self.submitted_at),
            "started_at_ts" => out.millis(name, started),
            "ended_at_ts" => out.millis(name, self.ended_at),
            "elapsed" => match self.reported.elapsed.as_str() {
                "" => out.text(name, &elapsed(self.elapsed_seconds)),
                said => out.text(name, said),
            },
            "state" => match self.reported.state.as_str() {
                "" => out.text(name, &self.state),
                said => out.text(name, said),
            },
            "allocation" if !self.reported.allocation.is_empty() => {
                out.value(name, Value::Object(self.reported.allocation.clone()))
            }
            "allocation" => {
                let nodes = match self.reported.nodes {
                    0 => self.nodes.split(',').filter(|n| !n.is_empty()).count() as u64,
                    n => n,
                };
                out.value(
                    name,
                    json!({"billing": self.billing, "cpus": self.alloc_cpus,
                           "gpus": self.alloc_gpus, "mem": self.alloc_mem_bytes,
                           "nodes": nodes}),
                )
            }
            "total_time_seconds" => out.value(name, total_time(&TimeSums::of(self))),
            "avg_cpu_usage" if agg && self.alloc_cpus > 0 => out.series(
                name,
                "global",
                percent(
                    self.cpu_seconds,
                    (self.alloc_cpus * self.aggregated_seconds) as f64,
                ),
            ),
            "avg_cpu_mem_usage" if agg && self.alloc_mem_bytes > 0 => out.series(
                name,
                "global",
                percent(self.mean_memory_bytes, self.alloc_mem_bytes as f64),
            ),
            // CEEMS's: the energy of the job's share of its nodes (uuid:ceems_host_power_watts:pue).
            "total_cpu_energy_usage_kwh" if agg && self.has(measured::HOST_ENERGY) => out.series(
                name,
                "total",
                Some(self.host_energy_joules / JOULES_PER_KWH),
            ),
            "total_cpu_emissions_gms" if agg && self.has(measured::EMISSIONS) => {
                out.series(name, emissions_key, Some(self.emissions_grams))
            }
            "avg_gpu_usage" if agg && gpus => {
                out.series(name, "global", Some(100.0 * self.mean_gpu_utilization))
            }
            "total_gpu_energy_usage_kwh" if agg && gpus && self.has(measured::GPU_ENERGY) => {
                out.series(name, "total", Some(self.gpu_energy_joules / JOULES_PER_KWH))
            }
            "total_io_write_stats" if agg => out.series(name, "bytes", Some(self.io_write_bytes)),
            "total_io_read_stats" if agg => out.series(name, "bytes", Some(self.io_read_bytes)),
            "tags" if !self.reported.tags.is_empty() => {
                out.value(name, Value::Object(self.reported.tags.clone()))
            }
            "tags" => out.value(name, self.tags()),
            "partition" => out.value(name, Value::from(self.partition.as_str())),
            "qos" => out.value(name, Value::from(self.qos.as_str())),
            "elapsed_seconds" => out.value(name, Value::from(self.elapsed_seconds)),
            "exit_code" => out.value(name, Value::from(self.exit_code.as_str())),
            "alloc_cpus" => out.value(name, Value::from(self.alloc_cpus)),
            "alloc_mem_bytes" => out.value(name, Value::from(self.alloc_mem_bytes)),
            "alloc_gpus" => out.value(name, Value::from(self.alloc_gpus)),
            "billing" => out.value(name, Value::from(self.billing)),
            "nodes" => out.value(name, Value::from(self.nodes.as_str())),
            "workdir" => out.value(name, Value::from(self.workdir.as_str())),
            "total_cpu_seconds" => out.value(name, number(self.cpu_seconds)),
            "avg_cpu_mem_usage_bytes" => out.value(name, number(self.mean_memory_bytes)),
            // Ours: null, not 0, where no power source gave a figure.
            "total_host_energy_usage_kwh" => out.value(
                name,
                self.measured_or_null(
                    measured::HOST_ENERGY,
                    self.host_energy_joules / JOULES_PER_KWH,
                ),
            ),
            "total_cpu_package_energy_kwh" => out.value(
                name,
                self.measured_or_null(
                    measured::CPU_PACKAGE_ENERGY,
                    self.cpu_energy_joules / JOULES_PER_KWH,
                ),
            ),
            "total_emissions_gms" => out.value(
                name,
                self.measured_or_null(measured::EMISSIONS, self.emissions_grams),
            ),
            "total_io_read_bytes" => out.value(name, number(self.io_read_bytes)),
            "total_io_write_bytes" => out.value(name, number(self.io_write_bytes)),
            "aggregates_status" => out.value(name, Value::from(self.aggregates_status.as_str())),
            "aggregates_updated_at_ts" => out.value(
                name,
                self.aggregates_updated_at
                    .map_or(Value::Null, |t| Value::from(t * 1000)),
            ),
            "last_updated_at_ts" => out.value(name, Value::from(self.last_updated_at * 1000)),
            "time_limit_seconds" => out.value(
                name,
                self.time_limit_seconds.map_or(Value::Null, Value::from),
            ),
            "memory_peak_bytes" => {
                out.value(name, self.memory_peak_bytes.map_or(Value::Null, number))
            }
            "findings" => out.value(
                name,
                serde_json::from_str(&self.findings).unwrap_or(Value::Array(Vec::new())),
            ),
            "actions" => out.value(
                name,
                self.actions.clone().unwrap_or(Value::Array(Vec::new())),
            ),
            // A series this job has no value of (not aggregated yet, or no such device).
            _ => {}
        }
    }

    /// CEEMS's Slurm tags: what is not a count or a time, each left out when empty.
    fn tags(&self) -> Value {
        let mut tags = Map::new();
        let mut text = |k: &str, v: &str| {
            if !v.is_empty() {
                tags.insert(k.to_owned(), Value::from(v));
            }
        };
        text("exit_code", &self.exit_code);
        match self.reported.nodelist.as_str() {
            "" => text("nodelist", &self.nodes),
            said => text("nodelist", said),
        }
        text("nodelistexp", &self.nodes.replace(',', "|"));
        text("partition", &self.partition);
        text("qos", &self.qos);
        text("workdir", &self.workdir);
        if let Some(gid) = self.gid {
            tags.insert("gid".into(), Value::from(gid));
        }
        if let Some(uid) = self.uid {
            tags.insert("uid".into(), Value::from(uid));
        }
        Value::Object(tags)
    }
}

pub(super) const JOULES_PER_KWH: f64 = 3.6e6;

/// A job's or a group's allocated times, in seconds of wall time.
#[derive(Default)]
pub(super) struct TimeSums {
    pub(super) walltime: f64,
    pub(super) cputime: f64,
    /// MiB × seconds, as CEEMS counts it.
    pub(super) cpumemtime: f64,
    pub(super) gputime: f64,
    /// CEEMS counts the wall time of the jobs that hold GPUs.
    pub(super) gpumemtime: f64,
}

impl TimeSums {
    /// CEEMS counts wall time from the job's start to its end, or to the last update while
    /// it runs.
    fn of(u: &UnitRow) -> TimeSums {
        let wall = match (u.started_at, u.ended_at) {
            (0, _) => 0.0,
            (start, Some(end)) => (end - start).max(0) as f64,
            (start, None) => (u.last_updated_at - start).max(0) as f64,
        };
        TimeSums {
            walltime: wall,
            cputime: u.alloc_cpus as f64 * wall,
            cpumemtime: (u.alloc_mem_bytes as f64 / MIB) * wall,
            gputime: u.alloc_gpus as f64 * wall,
            gpumemtime: if u.alloc_gpus > 0 { wall } else { 0.0 },
        }
    }
}

pub(super) const MIB: f64 = 1_048_576.0;

pub(super) fn total_time(t: &TimeSums) -> Value {
    let int = |v: f64| Value::from(v.round() as i64);
    json!({
        "alloc_cpumemtime": int(t.cpumemtime),
        "alloc_cputime": int(t.cputime),
        "alloc_gpumemtime": int(t.gpumemtime),
        "alloc_gputime": int(t.gputime),
        "walltime": int(t.walltime),
    })
}

/// `100 × part / whole`, none when `whole` is 0.
pub(super) fn percent(part: f64, whole: f64) -> Option<f64> {
    (whole > 0.0).then(|| 100.0 * part / whole)
}

/// A value as CEEMS writes it: to 8 decimals (the nearest double to that decimal, so a large
/// integer stays exact); a value that is not a number as null.
pub(super) fn number(v: f64) -> Value {
    format!("{v:.8}")
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

/// `seconds` as Slurm writes a duration: `[D-]HH:MM:SS`.
pub(super) fn elapsed(seconds: i64) -> String {
    crate::manager::elapsed_text(seconds)
}

/// A unix time as CEEMS writes it (`2023-02-21T15:48:20+0100`), in `tz`; none as empty.
pub(super) fn local_time(seconds: Option<i64>, tz: &TimeZone) -> String {
    seconds
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
        .map(|t| {
            t.to_zoned(tz.clone())
                .strftime("%Y-%m-%dT%H:%M:%S%z")
                .to_string()
        })
        .unwrap_or_default()
}

/// A JSON object written in the order its keys come, leaving out what CEEMS leaves out.
#[derive(Default)]
pub(super) struct JsonObject(String);

impl JsonObject {
    pub(super) fn value(&mut self, key: &str, v: Value) {
        self.0.push(if self.0.is_empty() { '{' } else { ',' });
        // Keys are field names: plain ASCII, written as they are.
        self.0.push('"');
        self.0.push_str(key);
        self.0.push_str("\":");
        self.0.push_str(&v.to_string());
    }

    /// Text, left out when empty.
    pub(super) fn text(&mut self, key: &str, v: &str) {
        if !v.is_empty() {
            self.value(key, Value::from(v));
        }
    }

    /// A unix time in seconds as milliseconds, left out when none or 0.
    fn millis(&mut self, key: &str, seconds: Option<i64>) {
        if let Some(s) = seconds.filter(|s| *s != 0) {
            self.value(key, Value::from(s.saturating_mul(1000)));
        }
    }

    /// A series object of one value, left out when there is none.
    pub(super) fn series(&mut self, key: &str, sub: &str, v: Option<f64>) {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            let mut m = Map::new();
            m.insert(sub.to_owned(), number(v));
            self.value(key, Value::Object(m));
        }
    }

    pub(super) fn finish(mut self) -> String {
        if self.0.is_empty() {
            self.0.push('{');
        }
        self.0.push('}');
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_durations_are_written_as_ceems_writes_them() {
        let paris = TimeZone::get("Europe/Paris").unwrap();
        assert_eq!(
            local_time(Some(1676990900), &paris),
            "2023-02-21T15:48:20+0100"
        );
        let athens = TimeZone::get("Europe/Athens").unwrap();
        assert_eq!(
            local_time(Some(1729002530), &athens),
            "2024-10-15T17:28:50+0300"
        );
        assert_eq!(local_time(None, &paris), "");
        assert_eq!(elapsed(497), "00:08:17");
        assert_eq!(elapsed(2 * 86400 + 620), "2-00:10:20");
        assert_eq!(number(53.477015404), json!(53.4770154));
        assert_eq!(number(f64::NAN), Value::Null);
        assert_eq!(number(2972084252000.0), json!(2972084252000.0));
    }

    #[test]
    fn allocated_times_count_as_ceems_counts_them() {
        // The pack's job 1481508: 16 CPUs, 320 GiB, no GPU, 497 s.
        let t = TimeSums {
            walltime: 497.0,
            cputime: 16.0 * 497.0,
            cpumemtime: 343597383680.0 / MIB * 497.0,
            ..Default::default()
        };
        assert_eq!(
            total_time(&t),
            json!({"alloc_cpumemtime": 162856960, "alloc_cputime": 7952,
                   "alloc_gpumemtime": 0, "alloc_gputime": 0, "walltime": 497})
        );
    }
}
