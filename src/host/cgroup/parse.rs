//! Parsers for cgroup files (v1 and v2). Each takes the file's text and returns a typed value or
//! a [`ParseError`] that says what was wrong; none of them panics, whatever the input.

use crate::host::ParseError;

fn parse_u64_field(line: usize, raw: &str) -> Result<u64, ParseError> {
    raw.parse::<u64>()
        .map_err(|_| ParseError::new(line, format!("`{raw}` is not an unsigned integer")))
}

/// A single unsigned number, as in `memory.current` or `memory.failcnt`.
pub fn single_u64(text: &str) -> Result<u64, ParseError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(ParseError::new(1, "empty file"));
    }
    parse_u64_field(1, t)
}

/// Digits with at most one decimal point, as the kernel prints PSI averages (`0.00`).
fn is_decimal(v: &str) -> bool {
    let mut points = 0;
    !v.is_empty()
        && !v.starts_with('.')
        && v.bytes().all(|b| {
            points += usize::from(b == b'.');
            b.is_ascii_digit() || (b == b'.' && points == 1)
        })
}

/// A limit such as `memory.max`: a number, or `max` for none (`None`).
pub fn limit(text: &str) -> Result<Option<u64>, ParseError> {
    match text.trim() {
        "max" => Ok(None),
        _ => single_u64(text).map(Some),
    }
}

/// Walks a flat keyed file (`cpu.stat`, `memory.stat`, `memory.events`, `cpuacct.stat`):
/// one `key value` pair per line, the value an unsigned integer.
pub fn flat_keyed<'a>(text: &'a str, mut each: impl FnMut(&'a str, u64)) -> Result<(), ParseError> {
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut fields = line.split_ascii_whitespace();
        let (Some(key), Some(value), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(ParseError::new(
                i + 1,
                format!("expected `key value`, got `{line}`"),
            ));
        };
        each(key, parse_u64_field(i + 1, value)?);
    }
    Ok(())
}

/// The values of `names` in a flat keyed file, 0 for names it lacks. Only the lines of
/// `names` are parsed, and reading stops once all are found: v2's `memory.stat` has some 50
/// lines and a scrape wants its first two.
pub fn keyed_values<const N: usize>(text: &str, names: [&str; N]) -> Result<[u64; N], ParseError> {
    let mut out = [0u64; N];
    let mut missing = N;
    let mut seen = [false; N];
    // Bytes, not `lines()` and `split_ascii_whitespace()`: v1's `memory.stat` puts the totals
    // a scrape wants some 35 lines down, and those iterators cost more than the reading.
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut number = 0;
    while start < bytes.len() {
        number += 1;
        let end = bytes[start..]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(bytes.len(), |p| start + p);
        let line = &bytes[start..end];
        let line_start = start;
        start = end + 1;
        let (key, after) = token(line, 0);
        let Some(k) = names.iter().position(|n| n.as_bytes() == key) else {
            continue;
        };
        let (value, after) = token(line, after);
        if value.is_empty() || !token(line, after).0.is_empty() {
            let shown = text[line_start..end].trim_end_matches('\r');
            return Err(ParseError::new(
                number,
                format!("expected `key value`, got `{shown}`"),
            ));
        }
        // Split at ASCII whitespace, so on character boundaries.
        let value = std::str::from_utf8(value).unwrap_or_default();
        let value = parse_u64_field(number, value)?;
        if !seen[k] {
            out[k] = value;
            seen[k] = true;
            missing -= 1;
            if missing == 0 {
                break;
            }
        }
    }
    Ok(out)
}

/// The first run of non-whitespace in `line` from `from`, and where the scan stopped.
fn token(line: &[u8], from: usize) -> (&[u8], usize) {
    let mut i = from;
    while i < line.len() && line[i].is_ascii_whitespace() {
        i += 1;
    }
    let begin = i;
    while i < line.len() && !line[i].is_ascii_whitespace() {
        i += 1;
    }
    (&line[begin..i], i)
}

/// Totals of a PSI file (`cpu.pressure`, `memory.pressure`), in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pressure {
    pub some_total_us: u64,
    pub full_total_us: u64,
}

/// Parses `some avg10=0.00 avg60=0.00 avg300=0.00 total=123` lines.
pub fn pressure(text: &str) -> Result<Pressure, ParseError> {
    let mut out = Pressure::default();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut fields = line.split_ascii_whitespace();
        let kind = fields.next().unwrap_or_default();
        let mut total = None;
        for field in fields {
            // A byte scan: `split_once` on a char was most of a PSI file's parsing.
            let Some(eq) = field.bytes().position(|b| b == b'=') else {
                return Err(ParseError::new(
                    i + 1,
                    format!("expected `name=value`, got `{field}`"),
                ));
            };
            let (k, v) = (&field[..eq], &field[eq + 1..]);
            match k {
                "total" => total = Some(parse_u64_field(i + 1, v)?),
                // Checked, not parsed: the averages are not exported.
                "avg10" | "avg60" | "avg300" if !is_decimal(v) => {
                    return Err(ParseError::new(i + 1, format!("`{v}` is not a number")));
                }
                _ => {}
            }
        }
        let total = total.ok_or_else(|| ParseError::new(i + 1, "no `total=` field"))?;
        match kind {
            "some" => out.some_total_us = total,
            "full" => out.full_total_us = total,
            other => {
                return Err(ParseError::new(
                    i + 1,
                    format!("unknown PSI line `{other}`"),
                ))
            }
        }
    }
    Ok(out)
}

/// Counts the CPUs of a cpuset list such as `0-3,8,10-11`. An empty list counts as zero CPUs.
pub fn cpuset_count(text: &str) -> Result<u64, ParseError> {
    let t = text.trim();
    if t.is_empty() {
        return Ok(0);
    }
    let mut count: u64 = 0;
    for part in t.split(',') {
        let n = match part.split_once('-') {
            None => {
                parse_u64_field(1, part)?;
                1
            }
            Some((a, b)) => {
                let (a, b) = (parse_u64_field(1, a)?, parse_u64_field(1, b)?);
                if b < a {
                    return Err(ParseError::new(
                        1,
                        format!("range `{part}` ends before it starts"),
                    ));
                }
                (b - a)
                    .checked_add(1)
                    .ok_or_else(|| ParseError::new(1, "cpuset too large"))?
            }
        };
        count = count
            .checked_add(n)
            .ok_or_else(|| ParseError::new(1, "cpuset too large"))?;
    }
    Ok(count)
}

/// The pids of a `cgroup.procs` file.
pub fn procs(text: &str) -> impl Iterator<Item = Result<u32, ParseError>> + '_ {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            l.trim()
                .parse::<u32>()
                .map_err(|_| ParseError::new(i + 1, format!("`{l}` is not a pid")))
        })
}

/// One device line of a v2 `io.stat` file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStat {
    pub major: u32,
    pub minor: u32,
    pub rbytes: u64,
    pub wbytes: u64,
    pub rios: u64,
    pub wios: u64,
}

/// Parses `8:0 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=0 dios=0` lines.
pub fn io_stat(text: &str) -> Result<Vec<IoStat>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut fields = line.split_ascii_whitespace();
        let Some(dev) = fields.next() else { continue };
        let Some((major, minor)) = dev.split_once(':') else {
            return Err(ParseError::new(
                i + 1,
                format!("`{dev}` is not a major:minor device"),
            ));
        };
        let mut stat = IoStat {
            major: major
                .parse()
                .map_err(|_| ParseError::new(i + 1, format!("bad major `{major}`")))?,
            minor: minor
                .parse()
                .map_err(|_| ParseError::new(i + 1, format!("bad minor `{minor}`")))?,
            ..IoStat::default()
        };
        for field in fields {
            let Some((k, v)) = field.split_once('=') else {
                return Err(ParseError::new(
                    i + 1,
                    format!("expected `name=value`, got `{field}`"),
                ));
            };
            let v = parse_u64_field(i + 1, v)?;
            match k {
                "rbytes" => stat.rbytes = v,
                "wbytes" => stat.wbytes = v,
                "rios" => stat.rios = v,
                "wios" => stat.wios = v,
                _ => {}
            }
        }
        out.push(stat);
    }
    Ok(out)
}

/// One device's line of the rdma controller's `rdma.current`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaUsage {
    pub device: String,
    pub handles: u64,
    pub objects: u64,
}

/// `rdma.current`: `<device> hca_handle=<n> hca_object=<n>` per device. A key the line lacks
/// counts 0; keys of later kernels are ignored.
pub fn rdma_current(text: &str) -> Result<Vec<HcaUsage>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut fields = line.split_ascii_whitespace();
        let Some(device) = fields.next() else {
            continue;
        };
        let mut usage = HcaUsage {
            device: device.to_owned(),
            handles: 0,
            objects: 0,
        };
        for field in fields {
            let Some((key, value)) = field.split_once('=') else {
                return Err(ParseError::new(
                    i + 1,
                    format!("expected `key=value`, got `{field}`"),
                ));
            };
            match key {
                "hca_handle" => usage.handles = parse_u64_field(i + 1, value)?,
                "hca_object" => usage.objects = parse_u64_field(i + 1, value)?,
                _ => {}
            }
        }
        out.push(usage);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn flat_keyed_reads_pairs_and_rejects_garbage() {
        let mut seen = Vec::new();
        flat_keyed("user_usec 10\nsystem_usec 20\n", |k, v| seen.push((k, v))).unwrap();
        assert_eq!(seen, vec![("user_usec", 10), ("system_usec", 20)]);
        let err = flat_keyed("user_usec ten\n", |_, _| {}).unwrap_err();
        assert_eq!(keyed_values("a 1\nb x\n", ["b"]).unwrap_err().line, 2);
        assert!(keyed_values("a\n", ["a"]).is_err());
        // Lines of other keys are not read, nor what follows the last key wanted.
        assert_eq!(
            keyed_values("x\na 1\nb 2\ny\n", ["b", "a"]).unwrap(),
            [2, 1]
        );
        assert_eq!(err.line, 1);
        assert!(flat_keyed("a 1 2\n", |_, _| {}).is_err());
        assert!(flat_keyed("lonely\n", |_, _| {}).is_err());
    }

    #[test]
    fn limits_and_singles() {
        assert_eq!(limit("max\n").unwrap(), None);
        assert_eq!(limit("4294967296\n").unwrap(), Some(4294967296));
        assert!(single_u64("").is_err());
        assert!(single_u64("-1").is_err());
    }

    #[test]
    fn pressure_totals() {
        let p = pressure(
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=12\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=7\n",
        )
        .unwrap();
        assert_eq!(
            p,
            Pressure {
                some_total_us: 12,
                full_total_us: 7
            }
        );
        assert!(pressure("full avg10=0.00\n").is_err());
        assert!(pressure("some avg10=0.0x avg60=0.00 avg300=0.00 total=1\n").is_err());
        assert!(pressure("some avg10=.5 avg60=0.00 avg300=0.00 total=1\n").is_err());
        assert!(pressure("some avg10=1.2.3 avg60=0.00 avg300=0.00 total=1\n").is_err());
        assert!(pressure("some avg10= avg60=0.00 avg300=0.00 total=1\n").is_err());
        assert!(pressure("some avg10=5. avg60=12 avg300=0.00 total=1\n").is_ok());
        assert!(pressure("some avg10=0.00 total\n").is_err());
        assert!(pressure("half total=1\n").is_err());
    }

    #[test]
    fn cpuset_counts() {
        assert_eq!(cpuset_count("1,41\n").unwrap(), 2);
        assert_eq!(cpuset_count("0-3,8,10-11").unwrap(), 7);
        assert_eq!(cpuset_count("\n").unwrap(), 0);
        assert!(cpuset_count("3-1").is_err());
        assert!(cpuset_count("a").is_err());
        assert!(cpuset_count("0-18446744073709551615,0-18446744073709551615").is_err());
    }

    #[test]
    fn rdma_current_reads_handles_and_objects_apart() {
        let got = rdma_current(
            "mlx4_0 hca_handle=2 hca_object=2000\nhfi1_0 hca_handle=479 hca_object=340\n",
        )
        .unwrap();
        assert_eq!(
            got[1],
            HcaUsage {
                device: "hfi1_0".into(),
                handles: 479,
                objects: 340
            }
        );
        assert_eq!(got.len(), 2);
        assert!(rdma_current("mlx4_0 hca_handle=max").is_err());
        assert!(rdma_current("mlx4_0 hca_handle").is_err());
        assert_eq!(rdma_current("\n").unwrap(), vec![]);
    }

    #[test]
    fn procs_and_io() {
        let pids: Result<Vec<u32>, _> = procs("1\n22\n\n").collect();
        assert_eq!(pids.unwrap(), vec![1, 22]);
        assert!(procs("x\n").next().unwrap().is_err());
        let io = io_stat("8:0 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=0 dios=0\n").unwrap();
        assert_eq!(io[0].wios, 4);
        assert!(io_stat("8 rbytes=1").is_err());
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in ".{0,200}") {
            let _ = flat_keyed(&s, |_, _| {});
            let _ = pressure(&s);
            let _ = cpuset_count(&s);
            let _ = procs(&s).count();
            let _ = io_stat(&s);
            let _ = limit(&s);
            let _ = rdma_current(&s);
        }

        #[test]
        fn cpuset_count_matches_expansion(ranges in proptest::collection::vec((0u64..512, 0u64..16), 1..8)) {
            let text: Vec<String> = ranges.iter().map(|(a, len)| if *len == 0 { a.to_string() } else { format!("{}-{}", a, a + len) }).collect();
            let expected: u64 = ranges.iter().map(|(_, len)| len + 1).sum();
            prop_assert_eq!(cpuset_count(&text.join(",")).unwrap(), expected);
        }

        #[test]
        fn keyed_values_agrees_with_flat_keyed(pairs in proptest::collection::vec(("[a-d]{1,2}", any::<u64>()), 0..20)) {
            let text: String = pairs.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
            let mut first = std::collections::HashMap::new();
            flat_keyed(&text, |k, v| { first.entry(k.to_owned()).or_insert(v); }).unwrap();
            let got = keyed_values(&text, ["a", "bc", "d"]).unwrap();
            let want = ["a", "bc", "d"].map(|k| first.get(k).copied().unwrap_or(0));
            prop_assert_eq!(got, want);
            let _ = keyed_values(&text.replace(' ', ""), ["a", "b"]);
        }

        /// Against the plain iterator version it replaced, on any text: same values, same
        /// refusals at the same lines.
        #[test]
        fn keyed_values_reads_any_text_as_the_iterator_version_did(
            lines in proptest::collection::vec("[ \t\r]{0,2}(a|bc|d|x)?([ \t]{1,2}[0-9x]{0,3}){0,3}[ \r]{0,2}", 0..12)
        ) {
            let text = lines.join("\n");
            let want = (|| -> Result<[u64; 3], usize> {
                let names = ["a", "bc", "d"];
                let (mut out, mut seen) = ([0u64; 3], [false; 3]);
                for (i, line) in text.lines().enumerate() {
                    let key = line.split_ascii_whitespace().next().unwrap_or_default();
                    let Some(k) = names.iter().position(|n| *n == key) else { continue };
                    let mut rest = line.split_ascii_whitespace().skip(1);
                    let (Some(v), None) = (rest.next(), rest.next()) else { return Err(i + 1) };
                    let v = v.parse::<u64>().map_err(|_| i + 1)?;
                    if !seen[k] { (out[k], seen[k]) = (v, true); }
                    if seen.iter().all(|s| *s) { break; }
                }
                Ok(out)
            })();
            prop_assert_eq!(keyed_values(&text, ["a", "bc", "d"]).map_err(|e| e.line), want);
        }

        #[test]
        fn flat_keyed_roundtrips(pairs in proptest::collection::vec(("[a-z_]{1,12}", any::<u64>()), 0..20)) {
            let text: String = pairs.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
            let mut seen = Vec::new();
            flat_keyed(&text, |k, v| seen.push((k.to_owned(), v))).unwrap();
            prop_assert_eq!(seen, pairs);
        }
    }
}
