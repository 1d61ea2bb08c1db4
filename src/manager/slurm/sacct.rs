//! `sacct --parsable2` records of jobs (allocations only), their AllocTRES and node lists.
//! Times are asked for as epoch seconds (`SLURM_TIME_FORMAT=%s`): Slurm 22.05 prints no UTC
//! offset with `%z`. The job name comes last, so a `|` in it cannot shift the other fields.

use crate::host::ParseError;
use crate::manager::{Allocation, Associations, UnitRecord};

/// The fields asked of sacct, in this order.
pub const FIELDS: &[&str] = &[
    "jobidraw",
    "partition",
    "qos",
    "account",
    "group",
    "gid",
    "user",
    "uid",
    "submit",
    "start",
    "end",
    "elapsed",
    "elapsedraw",
    "exitcode",
    "state",
    "alloctres",
    "nodelist",
    "workdir",
    "timelimitraw",
    "jobname",
];

/// `1795358897` → Some; `Unknown`, `None` and empty → None.
/// A time as we ask for it (`SLURM_TIME_FORMAT=%s`: epoch seconds), as CEEMS asks for it
/// (`2023-02-21T15:48:20+0100`), or as sacct prints it by default, without an offset
/// (`2023-02-21T15:48:20`), read in `zone` (CEEMS 0.12 reads it in `data.time_zone`).
fn time(
    line: usize,
    field: &str,
    v: &str,
    zone: &jiff::tz::TimeZone,
) -> Result<Option<i64>, ParseError> {
    match v {
        "" | "Unknown" | "None" => Ok(None),
        v => v
            .parse()
            .ok()
            .or_else(|| {
                jiff::Timestamp::strptime("%Y-%m-%dT%H:%M:%S%z", v)
                    .ok()
                    .map(|t| t.as_second())
            })
            .or_else(|| {
                jiff::civil::DateTime::strptime("%Y-%m-%dT%H:%M:%S", v)
                    .ok()?
                    .to_zoned(zone.clone())
                    .ok()
                    .map(|t| t.timestamp().as_second())
            })
            .map(Some)
            .ok_or_else(|| {
                ParseError::new(
                    line,
                    format!("{field} `{v}` is neither epoch seconds nor a time (YYYY-MM-DDTHH:MM:SS, with or without its offset)"),
                )
            }),
    }
}

/// CEEMS's sacct fields: ours but `timelimitraw`, with the job's name before its directory.
/// A line of 19 fields is one of these (ours has 20, the name last so that a `|` in it stays
/// in it): a site's sacct wrapper made for CEEMS answers in this order whatever it is asked.
pub const CEEMS_FIELDS: usize = 19;

fn optional_u32(line: usize, field: &str, v: &str) -> Result<Option<u32>, ParseError> {
    if v.is_empty() {
        return Ok(None);
    }
    v.parse()
        .map(Some)
        .map_err(|_| ParseError::new(line, format!("{field} `{v}` is not a number")))
}

/// `23081M` → bytes (binary units, as Slurm means them).
pub fn memory_bytes(v: &str) -> Option<u64> {
    let (num, mult) = match v.chars().last()? {
        'K' => (&v[..v.len() - 1], 1u64 << 10),
        'M' => (&v[..v.len() - 1], 1 << 20),
        'G' => (&v[..v.len() - 1], 1 << 30),
        'T' => (&v[..v.len() - 1], 1 << 40),
        'P' => (&v[..v.len() - 1], 1 << 50),
        c if c.is_ascii_digit() => (v, 1 << 20),
        _ => return None,
    };
    // Fractions appear for large values (`1.50T`).
    let n: f64 = num.parse().ok()?;
    (n.is_finite() && n >= 0.0).then(|| (n * mult as f64).round() as u64)
}

/// `billing=1,cpu=4,mem=16G,node=1,gres/gpu=2` (and `gres/gpu:a100=2`).
pub fn parse_tres(text: &str) -> Result<Allocation, String> {
    let mut t = Allocation::default();
    for item in text.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("TRES `{item}` is not name=value"))?;
        let count = || {
            v.parse::<u64>()
                .map_err(|_| format!("TRES `{item}`: `{v}` is not a count"))
        };
        match k {
            "cpu" => t.cpus = count()?,
            "mem" => {
                t.mem_bytes = memory_bytes(v).ok_or_else(|| format!("TRES `{item}`: bad memory"))?
            }
            "billing" => t.billing = count()?,
            "node" => t.nodes = count()?,
            "gres/gpu" => t.gpus = count()?,
            // Typed GPUs are also counted in gres/gpu; count them only when it is absent.
            k if k.starts_with("gres/gpu:") && t.gpus == 0 => t.gpus = count()?,
            _ => {}
        }
    }
    Ok(t)
}

/// `node[01-03,07],gpu1` → node01, node02, node03, node07, gpu1. `None assigned` → none.
pub fn expand_nodelist(text: &str) -> Result<Vec<String>, String> {
    if text.is_empty() || text == "None assigned" {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    // Split on commas outside brackets.
    let mut depth = 0;
    let mut start = 0;
    let mut parts = Vec::new();
    for (i, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if depth < 0 {
            return Err(format!("unbalanced `]` in `{text}`"));
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced `[` in `{text}`"));
    }
    parts.push(&text[start..]);
    for part in parts {
        let Some(open) = part.find('[') else {
            out.push(part.to_owned());
            continue;
        };
        let prefix = &part[..open];
        let close = part
            .rfind(']')
            .ok_or_else(|| format!("no `]` in `{part}`"))?;
        let suffix = &part[close + 1..];
        for range in part[open + 1..close].split(',') {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            let width = lo.len();
            let (a, b): (u64, u64) = (
                lo.parse()
                    .map_err(|_| format!("bad range `{range}` in `{part}`"))?,
                hi.parse()
                    .map_err(|_| format!("bad range `{range}` in `{part}`"))?,
            );
            if b < a || b - a > 100_000 {
                return Err(format!(
                    "range `{range}` in `{part}` is not a small ascending range"
                ));
            }
            for n in a..=b {
                out.push(format!("{prefix}{n:0width$}{suffix}"));
            }
        }
    }
    Ok(out)
}

/// Parses one record, a time without an offset read in UTC. `line` numbers the error.
pub fn parse_line(line_no: usize, line: &str) -> Result<UnitRecord, ParseError> {
    parse_line_in(line_no, line, &jiff::tz::TimeZone::UTC)
}

/// Parses one record, a time without an offset read in `zone`. `line` numbers the error.
pub fn parse_line_in(
    line_no: usize,
    line: &str,
    zone: &jiff::tz::TimeZone,
) -> Result<UnitRecord, ParseError> {
    let mut f: Vec<&str> = line.splitn(FIELDS.len(), '|').collect();
    if f.len() == CEEMS_FIELDS {
        // ...|nodelist|jobname|workdir → ...|nodelist|workdir|(no limit)|jobname
        let (name, workdir) = (f[17], f[18]);
        f.truncate(17);
        f.extend([workdir, "", name]);
    }
    if f.len() != FIELDS.len() {
        return Err(ParseError::new(
            line_no,
            format!("expected {} fields, got {}", FIELDS.len(), f.len()),
        ));
    }
    let job_id = f[0];
    if job_id.is_empty() || !job_id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError::new(
            line_no,
            format!("job id `{job_id}` is not numeric"),
        ));
    }
    let bad = |m: String| ParseError::new(line_no, m);
    let allocation = parse_tres(f[15]).map_err(bad)?;
    Ok(UnitRecord {
        uuid: job_id.to_owned(),
        partition: f[1].to_owned(),
        qos: f[2].to_owned(),
        account: f[3].to_owned(),
        group: f[4].to_owned(),
        gid: optional_u32(line_no, "gid", f[5])?,
        user: f[6].to_owned(),
        uid: optional_u32(line_no, "uid", f[7])?,
        submit: time(line_no, "submit", f[8], zone)?,
        start: time(line_no, "start", f[9], zone)?,
        end: time(line_no, "end", f[10], zone)?,
        elapsed_seconds: if f[12].is_empty() {
            0
        } else {
            f[12]
                .parse()
                .map_err(|_| bad(format!("elapsedraw `{}` is not seconds", f[12])))?
        },
        exit_code: f[13].to_owned(),
        state: f[14]
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned(),
        allocation,
        nodes: expand_nodelist(f[16]).map_err(bad)?,
        workdir: f[17].to_owned(),
        time_limit_seconds: match f[18] {
            "" | "UNLIMITED" | "Partition_Limit" | "INVALID" => None,
            v => Some(
                v.parse::<u64>()
                    .map_err(|_| bad(format!("timelimitraw `{v}` is not minutes")))?
                    .saturating_mul(60),
            ),
        },
        name: f[19].to_owned(),
        reported: crate::manager::Reported {
            state: f[14].to_owned(),
            elapsed: f[11].to_owned(),
            nodelist: f[16].to_owned(),
            nodes: allocation.nodes,
            ..Default::default()
        },
    })
}

/// Parses sacct's output; malformed lines are returned with their error and skipped.
pub fn parse_output(text: &str) -> (Vec<UnitRecord>, Vec<ParseError>) {
    let mut jobs = Vec::new();
    let mut errors = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match parse_line(i + 1, line) {
            Ok(j) => jobs.push(j),
            Err(e) => errors.push(e),
        }
    }
    (jobs, errors)
}

/// Users and projects (accounts) of `sacctmgr list associations --noheader --parsable2
/// format=account,user`: `physics|alice`, and `physics|` for the account's own association.
/// As CEEMS, root's account and root's associations are left out: no person's project.
pub fn parse_associations(text: &str) -> (Associations, Vec<ParseError>) {
    let mut a = Associations::default();
    let mut errors = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let Some((account, user)) = line.split_once('|') else {
            errors.push(ParseError::new(
                i + 1,
                format!("`{line}` is not account|user"),
            ));
            continue;
        };
        let (account, user) = (account.trim(), user.trim());
        if account.is_empty() || user.contains('|') {
            errors.push(ParseError::new(
                i + 1,
                format!("`{line}` is not account|user"),
            ));
            continue;
        }
        if account == ROOT || user == ROOT {
            continue;
        }
        if !a.projects.iter().any(|p| p == account) {
            a.projects.push(account.to_owned());
        }
        if !user.is_empty() {
            a.members.push((user.to_owned(), account.to_owned()));
        }
    }
    (a, errors)
}

/// Slurm's own account and user, which CEEMS leaves out of the associations.
pub const ROOT: &str = "root";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn associations_from_the_lab() {
        // `sacctmgr list associations --noheader --parsable2 format=account,user` on the lab.
        let (a, errors) = parse_associations(
            "root|\nroot|root\nchemistry|\nchemistry|bob\nphysics|\nphysics|alice\nbad line\n|x\n",
        );
        // Root's account and root's membership are not a person's project (as in CEEMS).
        assert_eq!(a.projects, ["chemistry", "physics"]);
        assert_eq!(
            a.members,
            [
                ("bob".to_owned(), "chemistry".to_owned()),
                ("alice".to_owned(), "physics".to_owned())
            ]
        );
        assert_eq!(errors.iter().map(|e| e.line).collect::<Vec<_>>(), [7, 8]);
    }

    /// Lines of CEEMS's sacct stand-in (`pkg/api/testdata/sacct`): its fields, in its order,
    /// its times with their offset.
    #[test]
    fn lines_in_ceems_order_and_time_format() {
        let (jobs, errors) = parse_output(
            "1481508|part1|qos1|acc2|grp2|1002|usr2|1002|2023-02-21T15:48:20+0100|2023-02-21T15:49:06+0100|2023-02-21T15:57:23+0100|00:08:17|4500|0:0|CANCELLED by 1002|billing=160,cpu=16,energy=1439089,gres/gpu=0,mem=320.5G,node=2|compute-[0-2]|test_script2|/home/usr2\n\
             2009248|part2|qos3|acc3|grp3|1003|usr3|1003|2023-02-21T15:48:20+0100|2023-02-21T15:49:06+0100|Unknown|00:00:17|17|0:0|RUNNING|billing=0,cpu=0,gres/gpu=0,mem=0,node=2|compute-[0-2]|test_script2|/home/usr3\n\
             7|p|q|a|g|1|u|1|2023-02-21T15:48:20 CET|||00:00:01|1|0:0|COMPLETED||n|j|/w",
        );
        assert_eq!(jobs.len(), 2, "{errors:?}");
        let job = &jobs[0];
        assert_eq!(job.submit, Some(1676990900));
        assert_eq!(job.start, Some(1676990946));
        assert_eq!(job.end, Some(1676991443));
        assert_eq!(
            (job.name.as_str(), job.workdir.as_str()),
            ("test_script2", "/home/usr2")
        );
        assert_eq!(job.time_limit_seconds, None);
        assert_eq!(job.allocation.cpus, 16);
        assert_eq!(job.nodes.len(), 3);
        assert_eq!(jobs[1].end, None);
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].message.contains("neither epoch seconds"),
            "{errors:?}"
        );
    }

    /// sacct's default times carry no offset: CEEMS 0.12 reads them in `data.time_zone`, and
    /// so does `parse_line_in`; with an offset or as epoch seconds the zone changes nothing.
    #[test]
    fn times_without_an_offset_are_read_in_the_given_zone() {
        let line = |t: &str| {
            format!("7|p|q|acc|grp|1001|usr|1001|{t}|{t}|Unknown|00:00:01|1|0:0|RUNNING|cpu=1,mem=1G,node=1|n1|/tmp|60|job")
        };
        let paris = jiff::tz::TimeZone::get("Europe/Paris").unwrap();
        let local = parse_line_in(1, &line("2023-02-21T15:48:20"), &paris).unwrap();
        let offset = parse_line_in(1, &line("2023-02-21T15:48:20+0100"), &paris).unwrap();
        let utc = parse_line(1, &line("2023-02-21T14:48:20")).unwrap();
        assert_eq!(local.submit, Some(1676990900));
        assert_eq!(offset.submit, local.submit);
        assert_eq!(utc.submit, local.submit);
        assert!(parse_line_in(1, &line("21/02/2023"), &paris).is_err());
    }

    /// Lines from the lab's Slurm 22.05 (`scripts/slurm-lab.sh`), with SLURM_TIME_FORMAT=%s.
    const LAB: &str = "\
1|debug|normal|physics|alice|2001|alice|2001|1795358897|1795358897|1795358926|00:00:29|29|0:0|CANCELLED by 0|billing=1,cpu=1,mem=300M,node=1|localhost|/tmp|60|wrap
8|debug|normal|chemistry|bob|2002|bob|2002|1795359473|None|1795359474|00:00:00|0|0:0|CANCELLED by 0||None assigned|/tmp|60|wrap
11|debug|normal|physics|alice|2001|alice|2001|1795360656|1795360656|1795360657|00:00:01|1|0:0|COMPLETED|billing=1,cpu=1,mem=1000M,node=1|localhost|/tmp|60|a|b name
12|debug|normal|physics|alice|2001|alice|2001|1795360700|1795360701|Unknown|00:00:09|9|0:0|RUNNING|billing=4,cpu=4,mem=16G,node=2,gres/gpu=2|node[01-02]|/home/alice|60|train
";

    #[test]
    fn lab_lines() {
        let (jobs, errors) = parse_output(LAB);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(jobs.len(), 4);
        assert_eq!(jobs[0].state, "CANCELLED");
        assert_eq!(jobs[0].allocation.mem_bytes, 300 << 20);
        assert_eq!(jobs[0].elapsed_seconds, 29);
        assert_eq!(jobs[1].start, None);
        assert!(jobs[1].nodes.is_empty());
        assert_eq!(jobs[1].allocation, Allocation::default());
        assert_eq!(
            jobs[2].name, "a|b name",
            "a `|` in the job name stays in it"
        );
        assert_eq!(jobs[3].end, None);
        assert_eq!(
            jobs[3].allocation,
            Allocation {
                cpus: 4,
                mem_bytes: 16 << 30,
                gpus: 2,
                billing: 4,
                nodes: 2
            }
        );
        assert_eq!(jobs[3].nodes, ["node01", "node02"]);
    }

    #[test]
    fn malformed_lines_are_errors_with_their_number() {
        let text = "1|debug\nx|d|n|a|g|1|u|1|1|1|1|0|0|0:0|RUNNING||n||j\n";
        let (jobs, errors) = parse_output(text);
        assert!(jobs.is_empty());
        assert_eq!(errors.iter().map(|e| e.line).collect::<Vec<_>>(), [1, 2]);
        assert!(parse_line(1, "1|d|n|a|g|1|u|1|yesterday|1|1|0|0|0:0|RUNNING||n||j").is_err());
        assert!(parse_line(1, "1|d|n|a|g|1|u|1|1|1|1|0|0|0:0|RUNNING|cpu=x|n||j").is_err());
    }

    #[test]
    fn tres_and_nodes() {
        assert_eq!(memory_bytes("1.5T"), Some(3 << 39));
        assert_eq!(memory_bytes("512"), Some(512 << 20));
        assert_eq!(memory_bytes("12Q"), None);
        assert_eq!(parse_tres("gres/gpu:a100=3").unwrap().gpus, 3);
        assert_eq!(parse_tres("gres/gpu=2,gres/gpu:a100=2").unwrap().gpus, 2);
        assert!(parse_tres("cpu").is_err());
        assert_eq!(
            expand_nodelist("cn[08-10,12],gpu1,x[1-2]-ib").unwrap(),
            ["cn08", "cn09", "cn10", "cn12", "gpu1", "x1-ib", "x2-ib"]
        );
        assert!(expand_nodelist("cn[1-").is_err());
        assert!(expand_nodelist("cn[5-1]").is_err());
        assert!(expand_nodelist("cn1]").is_err());
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in "\\PC*") {
            let _ = parse_output(&s);
            let _ = parse_tres(&s);
            let _ = expand_nodelist(&s);
            let _ = memory_bytes(&s);
        }
    }
}
