//! The columns cacct can show (CEEMS's fields, with its titles and widths), which `--format`
//! names, and `--helpformat`'s list of them and of the config's queries.

use super::queries::{self, SeriesQuery};
use super::table::{Style, Table};
use super::AcctError;

/// How a metric column's values are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Number {
    /// `%.2f`: usages in percent.
    Percent,
    /// `%f`: energies and emissions.
    Amount,
}

/// One column cacct can show.
#[derive(Debug)]
pub struct Field {
    /// What `--format` names it.
    pub key: &'static str,
    /// The API's field.
    pub tag: &'static str,
    /// What `--helpformat` lists.
    pub name: &'static str,
    pub help: &'static str,
    pub(super) title: &'static str,
    pub(super) min: usize,
    pub(super) max: usize,
    /// For the API's per-source maps (one column per source).
    pub(super) number: Option<Number>,
}

const fn field(
    key: &'static str,
    tag: &'static str,
    name: &'static str,
    help: &'static str,
    title: &'static str,
    (min, max): (usize, usize),
    number: Option<Number>,
) -> Field {
    Field {
        key,
        tag,
        name,
        help,
        title,
        min,
        max,
        number,
    }
}

/// Every field, in the table's order (CEEMS's, with its widths).
pub const FIELDS: &[Field] = &[
    field("jobid", "uuid", "jobID", "Job ID", "Job ID", (3, 7), None),
    field(
        "name",
        "name",
        "Name",
        "Name of the job",
        "Name",
        (5, 8),
        None,
    ),
    field(
        "account",
        "project",
        "Account",
        "Account name",
        "Account",
        (5, 8),
        None,
    ),
    field(
        "group",
        "groupname",
        "group",
        "Group name",
        "Group",
        (5, 5),
        None,
    ),
    field(
        "user",
        "username",
        "user",
        "User name",
        "User",
        (5, 5),
        None,
    ),
    field(
        "createdat",
        "created_at",
        "createdAt",
        "Job creation time",
        "Created",
        (5, 8),
        None,
    ),
    field(
        "startedat",
        "started_at",
        "startedAt",
        "Job start time",
        "Started",
        (5, 12),
        None,
    ),
    field(
        "endedat",
        "ended_at",
        "endedAt",
        "Job end time",
        "Ended",
        (5, 12),
        None,
    ),
    field(
        "elapsed",
        "elapsed",
        "elapsed",
        "Job elapsed time",
        "Elapsed",
        (5, 12),
        None,
    ),
    field(
        "totaltime",
        "total_time_seconds",
        "totalTime",
        "Total time (wall, CPU, memory and GPU allocation times) of the job in seconds",
        "Total Time(s)",
        (5, 12),
        None,
    ),
    field(
        "allocation",
        "allocation",
        "allocation",
        "Resources allocated to the job",
        "Resource Allocation",
        (5, 12),
        None,
    ),
    field(
        "state",
        "state",
        "state",
        "Job state",
        "State",
        (5, 5),
        None,
    ),
    field(
        "cpuusage",
        "avg_cpu_usage",
        "cpuUsage",
        "Average CPU usage over the duration of the job",
        "CPU Usage(%)",
        (5, 6),
        Some(Number::Percent),
    ),
    field(
        "cpumemoryusage",
        "avg_cpu_mem_usage",
        "cpuMemoryUsage",
        "Average CPU memory usage over the duration of the job",
        "CPU Mem. Usage(%)",
        (5, 6),
        Some(Number::Percent),
    ),
    field(
        "hostenergy",
        "total_cpu_energy_usage_kwh",
        "hostEnergy",
        "Total energy usage by the host duration of the job",
        "Host Energy(kWh)",
        (5, 8),
        Some(Number::Amount),
    ),
    field(
        "hostemissions",
        "total_cpu_emissions_gms",
        "hostEmissions",
        "Total eq. emissions due to host energy usage duration of the job",
        "Host Emissions(gms)",
        (5, 12),
        Some(Number::Amount),
    ),
    field(
        "gpuusage",
        "avg_gpu_usage",
        "gpuUsage",
        "Average GPU(s) usage over the duration of the job",
        "GPU Usage(%)",
        (5, 6),
        Some(Number::Percent),
    ),
    field(
        "gpumemoryusage",
        "avg_gpu_mem_usage",
        "gpuMemoryUsage",
        "Average GPU(s) memory usage over the duration of the job",
        "GPU Mem. Usage(%)",
        (5, 6),
        Some(Number::Percent),
    ),
    field(
        "gpuenergy",
        "total_gpu_energy_usage_kwh",
        "gpuEnergy",
        "Total energy usage by the GPU(s) duration of the job",
        "GPU Energy(kWh)",
        (5, 8),
        Some(Number::Amount),
    ),
    field(
        "gpuemissions",
        "total_gpu_emissions_gms",
        "gpuEmissions",
        "Total eq. emissions due to GPU(s) energy usage duration of the job",
        "GPU Emissions(gms)",
        (5, 12),
        Some(Number::Amount),
    ),
];

/// What a table shows without `--format` or `--long`.
pub const DEFAULT_FIELDS: &[&str] = &[
    "jobid",
    "account",
    "user",
    "elapsed",
    "cpuusage",
    "cpumemoryusage",
    "hostenergy",
    "hostemissions",
    "gpuusage",
    "gpumemoryusage",
    "gpuenergy",
    "gpuemissions",
];

/// The fields and instant queries `--format` names (case does not matter).
pub fn fields(
    names: &[String],
    series: &[SeriesQuery],
) -> Result<(Vec<&'static Field>, Vec<SeriesQuery>), AcctError> {
    let (mut fields, mut instant) = (Vec::new(), Vec::new());
    for n in names {
        let n = n.trim();
        if let Some(f) = FIELDS.iter().find(|f| f.key.eq_ignore_ascii_case(n)) {
            fields.push(f);
        } else if let Some(q) = series
            .iter()
            .find(|q| q.kind == queries::Kind::Instant && q.key.eq_ignore_ascii_case(n))
        {
            instant.push(q.clone());
        } else {
            return Err(AcctError::UnknownField(n.to_owned()));
        }
    }
    // Their columns come in the config's order, as CEEMS's come.
    instant.sort_by_key(|q: &SeriesQuery| series.iter().position(|s| s == q));
    instant.dedup();
    Ok((fields, instant))
}

/// `--helpformat`: each field's name and what it is, sorted by key, then the config's
/// queries (instant ones are columns, range ones series for `--ts.metrics`).
pub fn help_format(series: &[SeriesQuery]) -> String {
    let mut t = Table::new(Style::Ascii);
    t.header(vec!["Field".into(), "Description".into()], false);
    let mut sorted: Vec<&Field> = FIELDS.iter().collect();
    sorted.sort_by_key(|f| f.key);
    for f in sorted {
        t.row(vec![f.name.into(), f.help.into()], false);
    }
    for q in series {
        let what = match q.kind {
            queries::Kind::Instant => "column",
            queries::Kind::Range => "time series, --ts.metrics",
        };
        let help = if q.help.is_empty() { &q.title } else { &q.help };
        t.row(vec![q.key.clone(), format!("{help} ({what})")], false);
    }
    t.render()
}
