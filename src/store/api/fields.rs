//! The fields of `/units` and `/usage`: CEEMS's, in its order, then ours, which an answer
//! holds only when a request names them (`field=`).

use super::*;

/// The fields of `/units`. The first `CEEMS_UNIT_FIELDS` are CEEMS's `Unit` (its JSON names
/// and order; `SERIES` is the slice of its series objects); the rest are ours.
pub const UNIT_FIELDS: &[&str] = &[
    "cluster_id",
    "resource_manager",
    "uuid",
    "name",
    "project",
    "groupname",
    "username",
    "created_at",
    "started_at",
    "ended_at",
    "created_at_ts",
    "started_at_ts",
    "ended_at_ts",
    "elapsed",
    "state",
    "allocation",
    "total_time_seconds",
    "avg_cpu_usage",
    "avg_cpu_mem_usage",
    "total_cpu_energy_usage_kwh",
    "total_cpu_emissions_gms",
    "avg_gpu_usage",
    "avg_gpu_mem_usage",
    "total_gpu_energy_usage_kwh",
    "total_gpu_emissions_gms",
    "total_io_write_stats",
    "total_io_read_stats",
    "total_ingress_stats",
    "total_egress_stats",
    "total_custom_stats",
    "avg_custom_stats",
    "min_custom_stats",
    "max_custom_stats",
    "tags",
    // Ours.
    "partition",
    "qos",
    "elapsed_seconds",
    "exit_code",
    "alloc_cpus",
    "alloc_mem_bytes",
    "alloc_gpus",
    "billing",
    "nodes",
    "workdir",
    "total_cpu_seconds",
    "avg_cpu_mem_usage_bytes",
    "total_host_energy_usage_kwh",
    "total_cpu_package_energy_kwh",
    "total_emissions_gms",
    "total_io_read_bytes",
    "total_io_write_bytes",
    "aggregates_status",
    "aggregates_updated_at_ts",
    "last_updated_at_ts",
    "time_limit_seconds",
    "memory_peak_bytes",
    "findings",
    "actions",
];

/// How many of `UNIT_FIELDS` are CEEMS's: a request that names no field gets these.
pub(super) const CEEMS_UNIT_FIELDS: usize = 34;

/// The fields of `/usage`: CEEMS's `Usage`, then our sums.
pub(super) const USAGE_FIELDS: &[&str] = &[
    "cluster_id",
    "resource_manager",
    "num_units",
    "project",
    "groupname",
    "username",
    "total_time_seconds",
    "avg_cpu_usage",
    "avg_cpu_mem_usage",
    "total_cpu_energy_usage_kwh",
    "total_cpu_emissions_gms",
    "avg_gpu_usage",
    "avg_gpu_mem_usage",
    "total_gpu_energy_usage_kwh",
    "total_gpu_emissions_gms",
    "total_io_write_stats",
    "total_io_read_stats",
    "total_ingress_stats",
    "total_egress_stats",
    "total_custom_stats",
    "avg_custom_stats",
    "min_custom_stats",
    "max_custom_stats",
    // Ours.
    "total_elapsed_seconds",
    "total_cpu_seconds",
    "total_host_energy_usage_kwh",
    "total_cpu_package_energy_kwh",
    "total_emissions_gms",
    "total_io_read_bytes",
    "total_io_write_bytes",
];

/// How many of `USAGE_FIELDS` are CEEMS's.
pub(super) const CEEMS_USAGE_FIELDS: usize = 23;

/// Bits of a `FieldSet` that name fields; the bits above them name the time zone a rendered
/// job was written in (see `Api::zone`).
pub(super) const FIELD_BITS: u32 = 58;

#[cfg(test)]
#[test]
fn usage_has_the_series_of_units_in_the_same_order() {
    assert_eq!(SERIES.first(), Some(&"avg_cpu_usage"));
    assert_eq!(SERIES.last(), Some(&"max_custom_stats"));
    assert_eq!(&USAGE_FIELDS[7..23], SERIES);
}

const _: () = assert!(UNIT_FIELDS.len() <= FIELD_BITS as usize);
const _: () = assert!(USAGE_FIELDS.len() <= FIELD_BITS as usize);

/// The fields a request asks for, as a set over a field list (rendered in the list's order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct FieldSet(pub(super) u64);

impl FieldSet {
    /// The first `n` fields of a list.
    pub(super) const fn first(n: usize) -> FieldSet {
        FieldSet(u64::MAX >> (64 - n))
    }

    /// Every unit field, CEEMS's and ours.
    pub(super) const ALL_UNIT: FieldSet = FieldSet::first(UNIT_FIELDS.len());

    /// `field=` values as CEEMS reads them: a name the list does not have is dropped; none
    /// given is the first `default` fields; some given but none known is an error.
    pub(super) fn parse(
        list: &[&str],
        default: usize,
        names: &[String],
    ) -> Result<FieldSet, ApiError> {
        if names.is_empty() {
            return Ok(FieldSet::first(default));
        }
        let set = names
            .iter()
            .filter_map(|n| list.iter().position(|f| f == n))
            .fold(0u64, |set, i| set | (1 << i));
        match set {
            0 => Err(ApiError::bad("invalid query fields")),
            set => Ok(FieldSet(set)),
        }
    }

    pub(super) fn has(self, list: &[&str], name: &str) -> bool {
        list.iter()
            .position(|f| *f == name)
            .is_some_and(|i| self.0 & (1 << i) != 0)
    }
}

pub(super) fn cell(row: &DbRow, i: usize, kind: Col) -> Value {
    match kind {
        Col::Int => row
            .get::<Option<i64>>(i)
            .ok()
            .flatten()
            .map_or(Value::Null, Value::from),
        Col::Text => row
            .get::<Option<String>>(i)
            .ok()
            .flatten()
            .map_or(Value::Null, Value::from),
    }
}

#[derive(Clone, Copy)]
pub(super) enum Col {
    Int,
    Text,
}

/// Jobs per `RENDER_CHUNK` rendered by one query, under SQLite's bound-variable limit.
pub(super) const RENDER_CHUNK: usize = 4096;
