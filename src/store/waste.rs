//! What a job wasted, as SQL over its `units` row, for the admins' ranking (the API's
//! `/waste/admin`) and the campaigns to users: GPU-hours held at (near) zero use, core-hours
//! left idle, memory asked for and never used, core-hours of time limits never reached, and
//! the energy and CO2 of the idle cores and GPUs. Only figures Prometheus gave count.

/// What a group is ranked by, and the columns of the answer in order.
pub const WASTE_FIELDS: &[&str] = &[
    "idle_gpu_hours",
    "lost_cpu_hours",
    "unused_memory_tb_hours",
    "overrequested_core_hours",
    "waste_energy_kwh",
    "waste_emissions_g",
];

/// A job's waste, as SQL over one `units` row; `gpu_idle` is the GPU use (ratio) below which
/// its GPUs count as idle.
pub fn expressions(gpu_idle: f64) -> [String; 6] {
    let idle_gpus = format!(
        "(alloc_gpus > 0 AND gpu_utilization_max IS NOT NULL AND mean_gpu_utilization < {gpu_idle:.6})"
    );
    // Core-seconds allocated over the aggregated span and not used.
    let held = "(alloc_cpus * aggregated_seconds)";
    let lost = format!(
        "(CASE WHEN (measured & 1) != 0 AND {held} > cpu_seconds THEN {held} - cpu_seconds ELSE 0 END)"
    );
    let cpu_share = format!("(CASE WHEN {held} > 0 THEN {lost} / {held} ELSE 0 END)");
    let host = "(CASE WHEN (measured & 2) != 0 THEN host_energy_joules ELSE 0 END)";
    let gpu = "(CASE WHEN (measured & 16) != 0 THEN gpu_energy_joules ELSE 0 END)";
    let energy = format!("({host} * {cpu_share} + CASE WHEN {idle_gpus} THEN {gpu} ELSE 0 END)");
    [
        format!("sum(CASE WHEN {idle_gpus} THEN alloc_gpus * elapsed_seconds ELSE 0 END) / 3600.0"),
        format!("sum({lost}) / 3600.0"),
        "sum(CASE WHEN memory_peak_bytes IS NOT NULL AND alloc_mem_bytes > memory_peak_bytes
                  THEN (alloc_mem_bytes - memory_peak_bytes) * elapsed_seconds ELSE 0 END) / 3.6e15"
            .to_owned(),
        "sum(CASE WHEN state = 'COMPLETED' AND time_limit_seconds > elapsed_seconds
                  THEN alloc_cpus * (time_limit_seconds - elapsed_seconds) ELSE 0 END) / 3600.0"
            .to_owned(),
        format!(
            "CASE WHEN max(measured & 18) > 0 THEN sum({energy}) / 3.6e6 END"
        ),
        format!(
            "CASE WHEN max(measured & 4) > 0 THEN sum(CASE WHEN (measured & 4) != 0 AND {host} + {gpu} > 0
                  THEN emissions_grams * {energy} / ({host} + {gpu}) ELSE 0 END) END"
        ),
    ]
}

/// The figures summed over a group's rows, each read as a double on both databases
/// (PostgreSQL sums integers as numeric).
pub fn sums(gpu_idle: f64) -> [String; 6] {
    expressions(gpu_idle).map(|e| format!("CAST({e} AS DOUBLE PRECISION)"))
}
