//! Parsers for the /proc files the exporter reads: `stat`, `meminfo`, `cpuinfo` and a process's
//! `environ`. Like the cgroup parsers they return errors on malformed input and never panic.

use super::ParseError;

/// Aggregate CPU times of the `cpu` line of /proc/stat, in clock ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTimes {
    pub user: f64,
    pub nice: f64,
    pub system: f64,
    pub idle: f64,
    pub iowait: f64,
    pub irq: f64,
    pub softirq: f64,
    pub steal: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcStat {
    pub total: CpuTimes,
    /// Number of `cpuN` lines, i.e. online CPUs.
    pub cpus: u32,
}

pub fn proc_stat(text: &str) -> Result<ProcStat, ParseError> {
    let mut out = ProcStat::default();
    let mut seen_total = false;
    for (i, line) in text.lines().enumerate() {
        let mut fields = line.split_ascii_whitespace();
        let Some(name) = fields.next() else { continue };
        if name == "cpu" {
            let mut v = [0f64; 8];
            for (n, slot) in v.iter_mut().enumerate() {
                let raw = fields.next().ok_or_else(|| {
                    ParseError::new(
                        i + 1,
                        format!("`cpu` line has {n} fields, expected 8 or more"),
                    )
                })?;
                *slot = raw
                    .parse::<u64>()
                    .map_err(|_| ParseError::new(i + 1, format!("`{raw}` is not a tick count")))?
                    as f64;
            }
            out.total = CpuTimes {
                user: v[0],
                nice: v[1],
                system: v[2],
                idle: v[3],
                iowait: v[4],
                irq: v[5],
                softirq: v[6],
                steal: v[7],
            };
            seen_total = true;
        } else if name.len() > 3
            && name.starts_with("cpu")
            && name[3..].bytes().all(|b| b.is_ascii_digit())
        {
            out.cpus += 1;
        }
    }
    if !seen_total {
        return Err(ParseError::new(0, "no aggregate `cpu` line"));
    }
    Ok(out)
}

/// Calls `each(name, value)` for every line of /proc/meminfo, with names as CEEMS and
/// node_exporter spell them: `Active(anon)` becomes `Active_anon`, and values given in kB are
/// converted to bytes and get a `_bytes` suffix.
pub fn meminfo(text: &str, mut each: impl FnMut(String, f64)) -> Result<(), ParseError> {
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let Some((key, rest)) = line.split_once(':') else {
            return Err(ParseError::new(
                i + 1,
                format!("expected `Name: value`, got `{line}`"),
            ));
        };
        let mut fields = rest.split_ascii_whitespace();
        let raw = fields
            .next()
            .ok_or_else(|| ParseError::new(i + 1, format!("`{key}` has no value")))?;
        let value = raw
            .parse::<u64>()
            .map_err(|_| ParseError::new(i + 1, format!("`{raw}` is not a number")))?
            as f64;
        let mut name: String = key
            .chars()
            .map(|c| if c == '(' { '_' } else { c })
            .filter(|c| *c != ')')
            .collect();
        match fields.next() {
            Some("kB") => {
                name.push_str("_bytes");
                each(name, value * 1024.0);
            }
            None => each(name, value),
            Some(unit) => {
                return Err(ParseError::new(i + 1, format!("unknown unit `{unit}`")));
            }
        }
    }
    Ok(())
}

/// Logical CPUs per physical core, from /proc/cpuinfo: logical processors divided by the sum
/// of `cpu cores` over distinct `physical id`s; at least 1.
pub fn cpus_per_core(text: &str) -> u32 {
    let mut logical = 0u32;
    let mut sockets: Vec<(String, u32)> = Vec::new();
    let mut physical_id = String::new();
    let mut cores = 0u32;
    let mut flush = |physical_id: &mut String, cores: &mut u32, logical: &mut u32| {
        *logical += 1;
        match sockets.iter_mut().find(|(id, _)| id == physical_id) {
            Some(s) => s.1 = *cores,
            None => sockets.push((std::mem::take(physical_id), *cores)),
        }
        physical_id.clear();
        *cores = 0;
    };
    let mut in_block = false;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            if line.trim().is_empty() && in_block {
                flush(&mut physical_id, &mut cores, &mut logical);
                in_block = false;
            }
            continue;
        };
        match k.trim() {
            "processor" => {
                if in_block {
                    flush(&mut physical_id, &mut cores, &mut logical);
                }
                in_block = true;
            }
            "physical id" => physical_id = v.trim().to_owned(),
            "cpu cores" => cores = v.trim().parse().unwrap_or(0),
            _ => {}
        }
    }
    if in_block {
        flush(&mut physical_id, &mut cores, &mut logical);
    }
    let physical: u32 = sockets.iter().map(|(_, c)| *c).sum();
    let physical = if physical == 0 { logical } else { physical };
    (logical.max(1) / physical.max(1)).max(1)
}

/// The value of `name` in a NUL-separated `environ` blob, if present.
pub fn environ_var<'a>(data: &'a [u8], name: &str) -> Option<&'a [u8]> {
    data.split(|b| *b == 0).find_map(|entry| {
        let rest = entry.strip_prefix(name.as_bytes())?;
        let value = rest.strip_prefix(b"=")?;
        // Some archived environ files end in "\0\n".
        Some(value.strip_suffix(b"\n").unwrap_or(value))
    })
}

/// `SLURM_JOB_ID` from a process's `environ`, as a number.
pub fn slurm_job_id(environ: &[u8]) -> Result<Option<u64>, ParseError> {
    match environ_var(environ, "SLURM_JOB_ID") {
        None => Ok(None),
        Some(raw) => {
            let s = std::str::from_utf8(raw)
                .map_err(|_| ParseError::new(0, "SLURM_JOB_ID is not UTF-8"))?;
            s.trim()
                .parse::<u64>()
                .map(Some)
                .map_err(|_| ParseError::new(0, format!("SLURM_JOB_ID `{s}` is not a number")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn proc_stat_reads_total_and_cpus() {
        let s = proc_stat("cpu  1 2 3 4 5 6 7 8 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\ncpu1 1 2 3 4 5 6 7 8 0 0\nintr 1\n")
            .unwrap();
        assert_eq!(s.cpus, 2);
        assert_eq!(s.total.steal, 8.0);
        assert!(proc_stat("cpu 1 2\n").is_err());
        assert!(proc_stat("intr 1\n").is_err());
        assert!(proc_stat("cpu 1 2 3 4 5 6 7 x\n").is_err());
    }

    #[test]
    fn meminfo_names_and_units() {
        let mut got = Vec::new();
        meminfo(
            "MemTotal:  2 kB\nActive(anon): 1 kB\nHugePages_Total: 3\n",
            |k, v| got.push((k, v)),
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                ("MemTotal_bytes".to_owned(), 2048.0),
                ("Active_anon_bytes".to_owned(), 1024.0),
                ("HugePages_Total".to_owned(), 3.0)
            ]
        );
        assert!(meminfo("MemTotal 2 kB\n", |_, _| {}).is_err());
        assert!(meminfo("MemTotal: x kB\n", |_, _| {}).is_err());
        assert!(meminfo("MemTotal: 1 MB\n", |_, _| {}).is_err());
    }

    #[test]
    fn cpus_per_core_from_cpuinfo() {
        let block = |p: u32| format!("processor\t: {p}\nphysical id\t: 0\ncpu cores\t: 2\n\n");
        let text: String = (0..4).map(block).collect();
        assert_eq!(cpus_per_core(&text), 2);
        assert_eq!(cpus_per_core("processor : 0\n"), 1);
        assert_eq!(cpus_per_core(""), 1);
    }

    #[test]
    fn environ_lookup() {
        let env = b"A=1\0SLURM_JOB_ID=42\0SLURM_JOB_IDX=7\0\n";
        assert_eq!(slurm_job_id(env).unwrap(), Some(42));
        assert_eq!(
            environ_var(b"SLURM_JOB_ID=9\0\n", "SLURM_JOB_ID"),
            Some(&b"9"[..])
        );
        assert_eq!(slurm_job_id(b"B=2\0").unwrap(), None);
        assert!(slurm_job_id(b"SLURM_JOB_ID=abc\0").is_err());
    }

    proptest! {
        #[test]
        fn proc_parsers_never_panic(s in ".{0,300}", b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = proc_stat(&s);
            let _ = meminfo(&s, |_, _| {});
            let _ = cpus_per_core(&s);
            let _ = slurm_job_id(&b);
        }
    }
}

/// What the exporter takes from `/proc/<pid>/stat` (or `/proc/<pid>/task/<tid>/stat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidStat {
    /// The state letter: R, S, D, Z, T, t, X, I, …
    pub state: char,
    /// User and system time in clock ticks.
    pub utime: u64,
    pub stime: u64,
    pub num_threads: u64,
    pub ppid: u32,
    /// Clock ticks after boot at which the process started.
    pub start_ticks: u64,
}

/// Parses `pid (comm) state ppid … utime stime … num_threads …`. The command name may hold
/// spaces and parentheses, so fields are counted from the last `)`.
pub fn pid_stat(text: &str) -> Result<PidStat, ParseError> {
    let close = text
        .rfind(')')
        .ok_or_else(|| ParseError::new(1, "no `)` after the command name"))?;
    let rest = text.get(close + 1..).unwrap_or_default();
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // After `)`: state is field 3 of the man page, ppid 4, utime 14, stime 15, num_threads
    // 20, starttime 22.
    let field = |n: usize| -> Result<&str, ParseError> {
        fields
            .get(n - 3)
            .copied()
            .ok_or_else(|| ParseError::new(1, format!("field {n} is missing")))
    };
    let number = |n: usize| -> Result<u64, ParseError> {
        let f = field(n)?;
        f.parse()
            .map_err(|_| ParseError::new(1, format!("field {n} `{f}` is not an unsigned integer")))
    };
    let state = field(3)?;
    let mut chars = state.chars();
    let (Some(state), None) = (chars.next(), chars.next()) else {
        return Err(ParseError::new(
            1,
            format!("state `{state}` is not one letter"),
        ));
    };
    Ok(PidStat {
        state,
        utime: number(14)?,
        stime: number(15)?,
        num_threads: number(20)?,
        ppid: u32::try_from(number(4)?)
            .map_err(|_| ParseError::new(1, "field 4 (ppid) is out of range"))?,
        start_ticks: number(22)?,
    })
}

/// The name Prometheus users know a process state by.
pub fn state_name(state: char) -> &'static str {
    match state {
        'R' => "running",
        'S' => "sleeping",
        'D' => "disk_sleep",
        'Z' => "zombie",
        'T' => "stopped",
        't' => "tracing_stop",
        'X' | 'x' => "dead",
        'I' => "idle",
        'P' => "parked",
        'W' | 'K' => "waking",
        _ => "other",
    }
}

#[cfg(test)]
mod pid_stat_tests {
    use super::*;

    #[test]
    fn stat_lines() {
        let line = "4242 (python3 (x) y) R 1 4242 4242 0 -1 4194304 100 0 0 0 250 12 0 0 20 0 3 0 123 456 789";
        assert_eq!(
            pid_stat(line),
            Ok(PidStat {
                state: 'R',
                utime: 250,
                stime: 12,
                num_threads: 3,
                ppid: 1,
                start_ticks: 123,
            })
        );
        assert!(pid_stat("4242 (x").is_err());
        assert!(pid_stat("4242 (x) R 1").is_err());
        assert!(pid_stat("4242 (x) RS 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18").is_err());
        // A stat line cut before starttime is an error, not a process started at boot.
        assert!(
            pid_stat("4242 (x) R 1 4242 4242 0 -1 4194304 100 0 0 0 250 12 0 0 20 0 3 0").is_err()
        );
        assert_eq!(state_name('D'), "disk_sleep");
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in "\\PC*") {
            let _ = pid_stat(&s);
        }
    }
}
