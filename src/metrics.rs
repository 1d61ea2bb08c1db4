//! A small metric model and the Prometheus text exposition format (0.0.4).
//!
//! Collectors emit many series per job; rendering each job's label block once and sharing it
//! across families keeps a scrape to a handful of allocations per job (see `benches/scrape.rs`).

use std::fmt::Write as _;
use std::sync::Arc;

/// Content-Type of the text exposition format.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
}

impl MetricType {
    fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
        }
    }
}

/// A rendered label block such as `{hostname="",uuid="42"}`, shared between families.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Labels(Arc<str>);

impl Labels {
    /// Builds a label block; pairs are sorted by name as Prometheus clients do.
    pub fn new(pairs: &[(&str, &str)]) -> Labels {
        let mut sorted: Vec<&(&str, &str)> = pairs.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(b.0));
        let mut out = String::with_capacity(16 * pairs.len() + 2);
        if !sorted.is_empty() {
            out.push('{');
            for (i, (name, value)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(name);
                out.push_str("=\"");
                escape_label_value(value, &mut out);
                out.push('"');
            }
            out.push('}');
        }
        Labels(Arc::from(out))
    }

    pub fn empty() -> Labels {
        Labels(Arc::from(""))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn escape_label_value(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn escape_help(help: &str, out: &mut String) {
    for c in help.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Sample {
    pub labels: Labels,
    pub value: f64,
}

#[derive(Debug, Clone)]
pub struct Family {
    pub name: String,
    pub help: String,
    pub kind: MetricType,
    pub samples: Vec<Sample>,
}

/// The series a collector produced in one scrape.
#[derive(Debug, Default)]
pub struct MetricSet {
    families: Vec<Family>,
}

impl MetricSet {
    pub fn new() -> MetricSet {
        MetricSet::default()
    }

    /// Returns the family named `name`, creating it on first use.
    pub fn family(&mut self, name: &str, help: &str, kind: MetricType) -> &mut Family {
        // Families per collector are few, so a linear search beats hashing.
        let idx = match self.families.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.families.push(Family {
                    name: name.to_owned(),
                    help: help.to_owned(),
                    kind,
                    samples: Vec::new(),
                });
                self.families.len() - 1
            }
        };
        &mut self.families[idx]
    }

    pub fn push(&mut self, name: &str, help: &str, kind: MetricType, labels: Labels, value: f64) {
        self.family(name, help, kind)
            .samples
            .push(Sample { labels, value });
    }

    pub fn gauge(&mut self, name: &str, help: &str, labels: Labels, value: f64) {
        self.push(name, help, MetricType::Gauge, labels, value);
    }

    pub fn counter(&mut self, name: &str, help: &str, labels: Labels, value: f64) {
        self.push(name, help, MetricType::Counter, labels, value);
    }

    /// Moves every family of `other` into `self`, merging families of the same name.
    pub fn merge(&mut self, other: MetricSet) {
        for fam in other.families {
            match self.families.iter_mut().find(|f| f.name == fam.name) {
                Some(existing) => existing.samples.extend(fam.samples),
                None => self.families.push(fam),
            }
        }
    }

    pub fn families(&self) -> &[Family] {
        &self.families
    }

    pub fn len_samples(&self) -> usize {
        self.families.iter().map(|f| f.samples.len()).sum()
    }

    /// Encodes in the text format, families sorted by name and samples by labels, so the output
    /// is stable from one scrape to the next.
    pub fn encode_text(mut self, out: &mut String) {
        self.families.sort_by(|a, b| a.name.cmp(&b.name));
        for fam in &mut self.families {
            fam.samples.sort_by(|a, b| a.labels.cmp(&b.labels));
            out.push_str("# HELP ");
            out.push_str(&fam.name);
            out.push(' ');
            escape_help(&fam.help, out);
            out.push_str("\n# TYPE ");
            out.push_str(&fam.name);
            out.push(' ');
            out.push_str(fam.kind.as_str());
            out.push('\n');
            for s in &fam.samples {
                out.push_str(&fam.name);
                out.push_str(s.labels.as_str());
                out.push(' ');
                format_float(s.value, out);
                out.push('\n');
            }
        }
    }
}

/// Formats a float as Go's `strconv.FormatFloat(v, 'g', -1, 64)` does, which is what CEEMS and
/// other Go exporters print: shortest round-trip digits, in exponent form when the decimal
/// exponent is below -4 or at least 6 (so `180` stays plain and `21086208` is `2.1086208e+07`).
pub fn format_float(v: f64, out: &mut String) {
    if v.is_nan() {
        out.push_str("NaN");
        return;
    }
    if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
        return;
    }
    if v == 0.0 {
        out.push('0');
        return;
    }
    // `{:e}` gives the shortest round-trip mantissa digits, e.g. "2.1086208e7".
    let mut sci = String::with_capacity(24);
    let _ = write!(sci, "{v:e}");
    let (mantissa, exp) = match sci.split_once('e') {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (sci.as_str(), 0),
    };
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if negative {
        out.push('-');
    }
    const EPREC: i32 = 6;
    if !(-4..EPREC).contains(&exp) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        let abs = exp.unsigned_abs();
        if abs < 10 {
            out.push('0');
        }
        let _ = write!(out, "{abs}");
    } else if exp < 0 {
        out.push_str("0.");
        for _ in 0..(-exp - 1) {
            out.push('0');
        }
        out.push_str(&digits);
    } else {
        let int_len = (exp + 1) as usize;
        if digits.len() <= int_len {
            out.push_str(&digits);
            for _ in digits.len()..int_len {
                out.push('0');
            }
        } else {
            out.push_str(&digits[..int_len]);
            out.push('.');
            out.push_str(&digits[int_len..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(v: f64) -> String {
        let mut s = String::new();
        format_float(v, &mut s);
        s
    }

    #[test]
    fn floats_match_go_formatting() {
        assert_eq!(f(2.1086208e7), "2.1086208e+07");
        assert_eq!(f(0.45), "0.45");
        assert_eq!(f(89790.04), "89790.04");
        assert_eq!(f(2.0), "2");
        assert_eq!(f(180.0), "180");
        assert_eq!(f(1.6042172416e10), "1.6042172416e+10");
        assert_eq!(f(258218.293244), "258218.293244");
        assert_eq!(f(1360621494.0), "1.360621494e+09");
        assert_eq!(f(100000.0), "100000");
        assert_eq!(f(1000000.0), "1e+06");
        assert_eq!(f(0.0001), "0.0001");
        assert_eq!(f(0.00001), "1e-05");
        assert_eq!(f(-3.5), "-3.5");
        assert_eq!(f(f64::NAN), "NaN");
        assert_eq!(f(f64::INFINITY), "+Inf");
    }

    #[test]
    fn labels_are_sorted_and_escaped() {
        let l = Labels::new(&[("uuid", "a\"b"), ("hostname", "x\\y\nz")]);
        assert_eq!(l.as_str(), r#"{hostname="x\\y\nz",uuid="a\"b"}"#);
        assert_eq!(Labels::new(&[]).as_str(), "");
    }

    #[test]
    fn encoding_sorts_families_and_samples() {
        let mut set = MetricSet::new();
        set.gauge("b_metric", "B.", Labels::new(&[("k", "2")]), 1.0);
        set.gauge("b_metric", "B.", Labels::new(&[("k", "1")]), 2.0);
        set.counter("a_total", "A.", Labels::empty(), 3.0);
        let mut out = String::new();
        set.encode_text(&mut out);
        assert_eq!(
            out,
            "# HELP a_total A.\n# TYPE a_total counter\na_total 3\n\
             # HELP b_metric B.\n# TYPE b_metric gauge\nb_metric{k=\"1\"} 2\nb_metric{k=\"2\"} 1\n"
        );
    }
}
