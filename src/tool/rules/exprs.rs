//! The PromQL of the recording rules `tsdb create-recording-rules` writes: the names CEEMS's
//! rules record (its dashboards, and the stats-server's default queries, read them) over the
//! series each power source and GPU exporter has. Placeholders in `%…%` are filled per job:
//! `%J%` the scrape job, `%R%` the rate window, `%P%` the PUE, `%G%` the GPU exporter's job,
//! `%S%` the node power series, `%CL%` its chassis matcher, `%CC%` the country, `%V%` an
//! emission provider, `%F%` a static emission factor.

/// CPU use (%) of a job relative to the CPUs it was given.
pub const CPU_USAGE: &str = r#"(
    irate(ceems_compute_unit_cpu_user_seconds_total{job="%J%"}[%R%])
  + irate(ceems_compute_unit_cpu_system_seconds_total{job="%J%"}[%R%])
) * 100 / (ceems_compute_unit_cpus{job="%J%"} > 0)"#;

/// Memory use (%) of a job relative to its limit.
pub const MEMORY_USAGE: &str = r#"ceems_compute_unit_memory_used_bytes{job="%J%"} * 100
/ (ceems_compute_unit_memory_total_bytes{job="%J%"} > 0)"#;

/// A job's share of its node's CPU time (the node's busy modes).
const CPU_SHARE: &str = r#"(
    (
        irate(ceems_compute_unit_cpu_user_seconds_total{job="%J%"}[%R%])
      + irate(ceems_compute_unit_cpu_system_seconds_total{job="%J%"}[%R%])
    )
  / on (instance) group_left ()
    sum by (instance) (irate(ceems_cpu_seconds_total{job="%J%",mode!~"idle|iowait|steal"}[%R%]))
)"#;

/// A job's share of its node's used memory.
const MEMORY_SHARE: &str = r#"(
    ceems_compute_unit_memory_used_bytes{job="%J%"}
  / on (instance) group_left ()
    (ceems_meminfo_MemTotal_bytes{job="%J%"} - on (instance) ceems_meminfo_MemAvailable_bytes{job="%J%"})
)"#;

/// One over the number of jobs on the node (each job's equal part of what is left).
const EQUAL_SHARE: &str = r#"(
    ceems_compute_unit_memory_used_bytes{job="%J%"}
  / (ceems_compute_unit_memory_used_bytes{job="%J%"} * on (instance) group_left () ceems_compute_units{job="%J%"})
  > 0
)"#;

/// The part of a node's RAPL power that its CPU packages (`package`) or DRAM (`dram`) draw.
fn rapl_part(part: &str) -> String {
    format!(
        r#"(
    sum by (instance) (irate(ceems_rapl_{part}_joules_total{{job="%J%"}}[%R%]))
  / (
        sum by (instance) (irate(ceems_rapl_package_joules_total{{job="%J%"}}[%R%]))
      + sum by (instance) (irate(ceems_rapl_dram_joules_total{{job="%J%"}}[%R%]))
    )
)"#
    )
}

/// A BMC's node power less its GPUs' (`%G%`'s series `gpu_power` over `scaler`), per host:
/// above zero where the BMC counts the GPUs in.
pub fn bmc_power_less_gpus(gpu_power: &str, scaler: i64) -> String {
    format!(
        r#"(label_replace(%S%{{job="%J%"%CL%}}, "instancehost", "$1", "instance", "([^:]+):\\d+") - on (instancehost) group_left () sum by (instancehost) (label_replace({gpu_power}{{job="%G%"}} / {scaler}, "instancehost", "$1", "instance", "([^:]+):\\d+")))"#
    )
}

/// The node power of a BMC (IPMI DCMI or Redfish) as read.
pub const BMC_POWER: &str = r#"%S%{job="%J%"%CL%}"#;

/// hwmon's power series, and the node power it gives: its sockets' sensors summed.
pub const HWMON_SERIES: &str = "ceems_hwmon_power_current_watts";
pub const HWMON_POWER: &str =
    r#"sum without (sensor) (ceems_hwmon_power_current_watts{job="%J%",chip="socket"})"#;

/// Today's node power less the GPUs' of the same host (joined on `hostname`): DCGM's (a MIG
/// GPU counted once) or AMD device metrics'. `None` for AMD SMI, whose series name no host.
pub fn node_power_less_gpus(node: &str, gpu: &super::GpuRules) -> Option<String> {
    let gpus = if gpu.exporter.power_series == DCGM.power_series {
        r#"avg by (hostname,device) (label_replace(DCGM_FI_DEV_POWER_USAGE_INSTANT{job="%G%"}, "hostname", "$1", "Hostname","(.*)"))"#.to_owned()
    } else if gpu.exporter.power_series == AMD_DEVICE_METRICS.power_series {
        format!(
            r#"sum by (hostname,serial_number) ({}gpu_package_power{{job="%G%"}})"#,
            gpu.metric_prefix
        )
    } else {
        return None;
    };
    Some(format!(
        "({node} - on (hostname) group_left () sum by (hostname) ({gpus}))"
    ))
}

/// A job's power from its node's BMC power: 90% split by CPU time (and, with RAPL, between
/// packages and DRAM by their RAPL power, DRAM by memory), 10% equally between the jobs.
pub fn bmc_job_power(rapl: bool) -> String {
    let node = "instance:%S%:pue{job=\"%J%\"}";
    let mut expr = format!("0.9 * {node}");
    if rapl {
        expr += &format!("\n* on (instance) group_left () {}", rapl_part("package"));
    }
    expr += &format!("\n* on (instance) group_right () {CPU_SHARE}");
    if rapl {
        expr += &format!(
            "\n+\n0.9 * {node}\n* on (instance) group_left () {}\n* on (instance) group_right () {MEMORY_SHARE}",
            rapl_part("dram")
        );
    }
    expr + &format!("\n+\n0.1 * {node}\n* on (instance) group_right () {EQUAL_SHARE}")
}

/// A job's power from its Cray node's counters: the CPU domain by CPU time, the memory domain
/// by memory, the rest of the node (less every measured domain) equally.
pub fn cray_job_power() -> String {
    let domain = |d: &str| {
        format!("instance:ceems_cray_pm_counters_power_watts:pue{{domain=\"{d}\",job=\"%J%\"}}")
    };
    format!(
        "{} * on (instance) group_right () {CPU_SHARE}\n+\n{} * on (instance) group_right () {MEMORY_SHARE}\n+\n(\n    {}\n  - on (instance)\n    sum by (instance) (instance:ceems_cray_pm_counters_power_watts:pue{{domain!~\"node\",job=\"%J%\"}})\n)\n* on (instance) group_right () {EQUAL_SHARE}",
        domain("cpu"),
        domain("memory"),
        domain("node"),
    )
}

/// The Cray nodes' power less their accelerators'.
pub const CRAY_NODES_POWER: &str = r#"sum by (job) (
  %P% * (
      ceems_cray_pm_counters_power_watts{domain="node",job="%J%"}
    - on (instance) group_left ()
      sum by (instance) (ceems_cray_pm_counters_power_watts{domain=~"accel.*",job="%J%"})
  )
)"#;

/// A job's power from its node's RAPL counters: packages by CPU time, DRAM by memory.
pub fn rapl_job_power() -> String {
    format!(
        r#"(
    sum by (instance) (irate(instance:ceems_rapl_package_joules_total:pue{{job="%J%"}}[%R%]))
  * on (instance) group_right () {CPU_SHARE}
+
    sum by (instance) (irate(instance:ceems_rapl_dram_joules_total:pue{{job="%J%"}}[%R%]))
  * on (instance) group_right () {MEMORY_SHARE}
)"#
    )
}

/// The RAPL nodes' power.
pub const RAPL_NODES_POWER: &str = r#"sum by (job) (
  %P% * (
      sum by (instance) (irate(ceems_rapl_package_joules_total{job="%J%"}[%R%]))
    + sum by (instance) (irate(ceems_rapl_dram_joules_total{job="%J%"}[%R%]))
  )
)"#;

/// Average CPU use (%) of the scrape job's nodes.
pub const NODES_CPU_USAGE: &str = r#"avg by (job) (
  (
      sum by (job, instance) (irate(ceems_cpu_seconds_total{job="%J%",mode!~"idle|iowait|steal"}[%R%])) * 100
    / on (instance) group_left ()
      ((ceems_cpu_count{job="%J%"} > 0) / ceems_cpu_per_core_count{job="%J%"})
  )
)"#;

/// Average memory use (%) of the scrape job's nodes.
pub const NODES_MEMORY_USAGE: &str = r#"avg by (job) (
  ((1 - (ceems_meminfo_MemAvailable_bytes{job="%J%"} / ceems_meminfo_MemTotal_bytes{job="%J%"})))
) * 100"#;

/// Emissions (g/s) of `energy_rate` (a recorded power over 3.6e+06, in kWh/s) with a
/// provider's factor series; `common_label` is what CEEMS's GPU rules join on.
pub fn emissions_by_provider(energy_rate: &str, common_label: bool) -> String {
    let factor = r#"ceems_emissions_gCo2_kWh{country_code="%CC%",provider="%V%"%EI%}"#;
    let factor = match common_label {
        true => format!(r#"label_replace({factor}, "common_label", "mock", "instance", "(.*)")"#),
        false => factor.to_owned(),
    };
    format!(
        "label_replace(\n  {energy_rate},\n  \"provider\", \"%V%\", \"instance\", \"(.*)\"\n)\n* on (provider) group_left () {factor}"
    )
}

/// Emissions (g/s) of `energy_rate` with the static factor `%F%` of provider `%V%`.
pub fn emissions_static(energy_rate: &str) -> String {
    format!("label_replace(\n  {energy_rate},\n  \"provider\", \"%V%\", \"instance\", \"(.*)\"\n)\n* %F%")
}

/// A scrape job's emissions (g/s) with every provider's factor (`what` is `host` or `gpu`,
/// `%J%` the job named).
pub fn job_emissions_by_provider(what: &str) -> String {
    format!(
        r#"sum by (job, country_code, country, provider) (
  (
      job:ceems_{what}_power_watts:pue{{job="%J%"}} / 3.6e+06
    * on (job) group_right ()
      label_replace(ceems_emissions_gCo2_kWh%EI%, "job", "%J%", "instance", "(.*)")
  )
)"#
    )
}

/// A scrape job's emissions (g/s) with the static factor `%F%` of provider `%V%`.
pub fn job_emissions_static(what: &str) -> String {
    format!(
        r#"label_replace(
  label_replace(
    %F% * job:ceems_{what}_power_watts:pue{{job="%J%"}} / 3.6e+06,
    "provider", "%V%", "instance", "(.*)"
  ),
  "country_code", "%CC%", "instance", "(.*)"
)"#
    )
}

/// What the rules of one GPU exporter read: its series, and the labels that join them to
/// ceems's `ceems_compute_unit_gpu_index_flag`.
#[derive(Debug)]
pub struct GpuExporter {
    /// The series CEEMS's tool recognises the exporter by (its power).
    pub power_series: &'static str,
    /// Power in watts is the series over this.
    pub power_scaler: i64,
    /// Labels shared with ceems's GPU series after the relabel configs.
    pub on: &'static str,
    pub usage: &'static str,
    pub memory_usage: &'static str,
    pub device_power_record: &'static str,
    pub device_power: &'static str,
    pub jobs_usage: &'static str,
    pub jobs_memory_usage: &'static str,
    pub jobs_power: &'static str,
}

/// NVIDIA's DCGM exporter (its usage series is chosen by what the exporter has).
pub const DCGM: GpuExporter = GpuExporter {
    power_series: "DCGM_FI_DEV_POWER_USAGE_INSTANT",
    power_scaler: 1,
    on: "gpuuuid,gpuiid",
    usage: r#"%U%{job="%G%"}"#,
    memory_usage: r#"(
    DCGM_FI_DEV_FB_USED{job="%G%"} * 100
  / (DCGM_FI_DEV_FB_USED{job="%G%"} + DCGM_FI_DEV_FB_FREE{job="%G%"})
)"#,
    device_power_record: "dev:DCGM_FI_DEV_POWER_USAGE_INSTANT:pue",
    device_power: r#"%P% * DCGM_FI_DEV_POWER_USAGE_INSTANT{job="%G%"}"#,
    jobs_usage: r#"avg by (job) (DCGM_FI_DEV_GPU_UTIL{job="%G%"})"#,
    jobs_memory_usage: r#"avg by (job) (
  (
      DCGM_FI_DEV_FB_USED{job="%G%"} * 100
    / (DCGM_FI_DEV_FB_USED{job="%G%"} + DCGM_FI_DEV_FB_FREE{job="%G%"})
  )
)"#,
    jobs_power: r#"sum by (job)(%P% * DCGM_FI_DEV_POWER_USAGE_INSTANT{job="%G%"})"#,
};

/// AMD's SMI exporter (power in microwatts).
pub const AMD_SMI: GpuExporter = GpuExporter {
    power_series: "amd_gpu_power",
    power_scaler: 1_000_000,
    on: "index",
    usage: r#"amd_gpu_use_percent{job="%G%"}"#,
    memory_usage: r#"amd_gpu_memory_use_percent{job="%G%"}"#,
    device_power_record: "dev:amd_gpu_power_watts:pue",
    device_power: r#"%P% * amd_gpu_power{job="%G%"} / 1e6"#,
    jobs_usage: r#"avg by (job) (amd_gpu_use_percent{job="%G%"})"#,
    jobs_memory_usage: r#"avg by (job) (amd_gpu_memory_use_percent{job="%G%"})"#,
    jobs_power: r#"sum by (job)(%P% * amd_gpu_power{job="%G%"} / 1e6)"#,
};

/// AMD's device metrics exporter. Its per-job power divides by 1e6 as CEEMS's rule does
/// (dashboards compare against it).
pub const AMD_DEVICE_METRICS: GpuExporter = GpuExporter {
    power_series: "gpu_power_usage",
    power_scaler: 1,
    on: "index",
    usage: r#"gpu_gfx_activity{job="%G%"}"#,
    memory_usage: r#"(gpu_used_vram{job="%G%"} * 100 / gpu_total_vram{job="%G%"})"#,
    device_power_record: "dev:gpu_power_usage_watts:pue",
    device_power: r#"%P% * gpu_power_usage{job="%G%"}"#,
    jobs_usage: r#"avg by (job) (gpu_gfx_activity{job="%G%"})"#,
    jobs_memory_usage: r#"avg by (job) ((gpu_used_vram{job="%G%"} * 100 / gpu_total_vram{job="%G%"}))"#,
    jobs_power: r#"sum by (job)(%P% * gpu_power_usage{job="%G%"} / 1e6)"#,
};

/// The GPU index flag of the job's units, joined on the exporter's labels.
pub fn per_unit(exporter: &GpuExporter, what: &str) -> String {
    format!(
        "{what}\n* on ({}) group_right () ceems_compute_unit_gpu_index_flag{{job=\"%J%\"}}",
        exporter.on
    )
}

/// A unit's GPU power: the device's power split by the unit's share of the device's SMs (by
/// the SMs' activity and occupancy when DCGM's profiling series are there).
pub fn gpu_unit_power(exporter: &GpuExporter, by_activity: bool) -> String {
    let device = exporter.on.split(',').next().unwrap_or(exporter.on);
    let share = match by_activity {
        true => {
            let product = r#"DCGM_FI_PROF_SM_ACTIVE{job="%G%"} * on (gpuuuid, gpuiid) DCGM_FI_PROF_SM_OCCUPANCY{job="%G%"} * on (gpuuuid, gpuiid) ceems_compute_unit_gpu_sm_count{job="%J%"}"#;
            format!(
                "(\n  (({product}))\n  / on (gpuuuid) group_left ()\n  (sum by (gpuuuid) (({product}) > 0))\n)"
            )
        }
        false => format!(
            "(\n    ceems_compute_unit_gpu_sm_count{{job=\"%J%\"}}\n  / on ({device}) group_left ()\n    (sum by ({device}) (ceems_compute_unit_gpu_sm_count{{job=\"%J%\"}}) > 0)\n)"
        ),
    };
    per_unit(
        exporter,
        &format!(
            "{share}\n* on ({device}) group_right () {}{{job=\"%G%\"}}",
            exporter.device_power_record
        ),
    )
}

/// Today's per-unit IO and network rates (eBPF's counters), and the scrape job's totals:
/// (record suffix, counter). The per-unit rules rate over the job's window; the totals, as
/// CEEMS writes them, over a minute of every target's counters.
pub const IO_RATES: [(&str, &str); 6] = [
    ("read_bytes", "read_bytes_total"),
    ("read_requests", "read_requests_total"),
    ("read_errors", "read_errors_total"),
    ("write_bytes", "write_bytes_total"),
    ("write_requests", "write_requests_total"),
    ("write_errors", "write_errors_total"),
];
pub const NET_RATES: [(&str, &str); 4] = [
    ("ingress_bytes", "ingress_bytes_total"),
    ("ingress_packets", "ingress_packets_total"),
    ("egress_bytes", "egress_bytes_total"),
    ("egress_packets", "egress_packets_total"),
];

/// A unit's rate of eBPF counter `ceems_ebpf_COUNTER`.
pub fn unit_rate(counter: &str) -> String {
    format!(r#"irate(ceems_ebpf_{counter}{{job="%J%"}}[%R%])"#)
}

/// The total rate of eBPF counter `ceems_ebpf_COUNTER` by `labels` (`mountpoint`, or
/// `family, proto`).
pub fn total_rate(counter: &str, labels: &str) -> String {
    format!(
        "sum by (job, {labels}) (\n  sum by (job, {labels}, instance) (irate(ceems_ebpf_{counter}[1m]))\n)"
    )
}
