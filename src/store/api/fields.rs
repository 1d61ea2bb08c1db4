//! The fields of `/units`, as the API names them and as SQL reads them.

use super::*;

/// A field of `/units`: its name in the API, its SQL expression, and its type.
pub(super) struct UnitField {
    pub(super) name: &'static str,
    pub(super) sql: &'static str,
}

#[derive(Clone, Copy)]
pub(super) enum Col {
    Int,
    Real,
    Text,
}

const FINDINGS_JSON: &str = "coalesce(findings, '[]')";

pub(super) const UNIT_FIELDS: &[UnitField] = &[
    UnitField { name: "cluster_id", sql: "cluster_id" },
    UnitField {
        name: "resource_manager",
        sql: "(SELECT c.manager FROM clusters c WHERE c.id = cluster_id)",
    },
    UnitField { name: "uuid", sql: "uuid" },
    UnitField { name: "name", sql: "name" },
    UnitField { name: "project", sql: "project" },
    UnitField { name: "group", sql: "grp" },
    UnitField { name: "user", sql: "usr" },
    UnitField { name: "partition", sql: "partition" },
    UnitField { name: "qos", sql: "qos" },
    UnitField { name: "created_at_ts", sql: "submitted_at" },
    UnitField { name: "started_at_ts", sql: "NULLIF(started_at, 0)" },
    UnitField { name: "ended_at_ts", sql: "ended_at" },
    UnitField { name: "elapsed_seconds", sql: "elapsed_seconds" },
    UnitField { name: "state", sql: "state" },
    UnitField { name: "exit_code", sql: "exit_code" },
    UnitField { name: "alloc_cpus", sql: "alloc_cpus" },
    UnitField { name: "alloc_mem_bytes", sql: "alloc_mem_bytes" },
    UnitField { name: "alloc_gpus", sql: "alloc_gpus" },
    UnitField { name: "billing", sql: "billing" },
    UnitField { name: "nodes", sql: "nodes" },
    UnitField { name: "workdir", sql: "workdir" },
    UnitField { name: "total_cpu_seconds", sql: "cpu_seconds" },
    UnitField {
        name: "avg_cpu_usage",
        sql: "CASE WHEN alloc_cpus * aggregated_seconds > 0 THEN 100.0 * cpu_seconds / (alloc_cpus * aggregated_seconds) END" },
    UnitField { name: "avg_cpu_mem_usage_bytes", sql: "mean_memory_bytes" },
    UnitField { name: "avg_gpu_usage", sql: "100.0 * mean_gpu_utilization" },
    UnitField { name: "total_cpu_energy_usage_kwh", sql: "cpu_energy_joules / 3.6e6" },
    UnitField { name: "total_host_energy_usage_kwh", sql: "host_energy_joules / 3.6e6" },
    UnitField { name: "total_gpu_energy_usage_kwh", sql: "gpu_energy_joules / 3.6e6" },
    UnitField { name: "total_emissions_gms", sql: "emissions_grams" },
    UnitField { name: "total_io_read_bytes", sql: "io_read_bytes" },
    UnitField { name: "total_io_write_bytes", sql: "io_write_bytes" },
    UnitField { name: "aggregates_status", sql: "aggregates_status" },
    UnitField { name: "aggregates_updated_at_ts", sql: "aggregates_updated_at" },
    UnitField { name: "last_updated_at_ts", sql: "last_updated_at" },
    UnitField { name: "time_limit_seconds", sql: "time_limit_seconds" },
    UnitField { name: "memory_peak_bytes", sql: "memory_peak_bytes" },
    // JSON text: embedded as JSON by `FieldSet::json_object`.
    UnitField { name: "findings", sql: FINDINGS_JSON },
];

/// The fields a `/units` request asks for, as a set over `UNIT_FIELDS` (rendered in that
/// order, each once).
#[derive(Clone, Copy)]
pub(super) struct FieldSet(pub(super) u64);

const _: () = assert!(UNIT_FIELDS.len() <= 64, "FieldSet holds one bit per field");

impl FieldSet {
    pub(super) const ALL: FieldSet = FieldSet(u64::MAX >> (64 - UNIT_FIELDS.len()));

    pub(super) fn parse(names: &[String]) -> Result<FieldSet, ApiError> {
        if names.is_empty() {
            return Ok(FieldSet::ALL);
        }
        let mut set = 0u64;
        for name in names {
            let i = UNIT_FIELDS
                .iter()
                .position(|u| u.name == name)
                .ok_or_else(|| {
                    ApiError::bad(format!(
                        "unknown field `{name}` (known: {})",
                        UNIT_FIELDS
                            .iter()
                            .map(|u| u.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })?;
            set |= 1 << i;
        }
        Ok(FieldSet(set))
    }

    /// The fields as one JSON object per row (text), in the database's own spelling.
    pub(super) fn json_object(self, backend: Backend) -> String {
        let pairs = UNIT_FIELDS
            .iter()
            .enumerate()
            .filter(|(i, _)| self.0 & (1 << i) != 0)
            .map(|(_, f)| match f.sql {
                FINDINGS_JSON => format!("'{}', {}", f.name, backend.json_column(f.sql)),
                sql => format!("'{}', {sql}", f.name),
            })
            .collect::<Vec<_>>()
            .join(", ");
        backend.json_object(&pairs)
    }
}

/// Jobs per `RENDER_CHUNK` rendered by one query, under SQLite's bound-variable limit.
pub(super) const RENDER_CHUNK: usize = 4096;

pub(super) fn cell(row: &DbRow, i: usize, kind: Col) -> Value {
    match kind {
        Col::Int => row
            .get::<Option<i64>>(i)
            .ok()
            .flatten()
            .map_or(Value::Null, Value::from),
        Col::Real => row
            .get::<Option<f64>>(i)
            .ok()
            .flatten()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Null, Value::Number),
        Col::Text => row
            .get::<Option<String>>(i)
            .ok()
            .flatten()
            .map_or(Value::Null, Value::from),
    }
}
