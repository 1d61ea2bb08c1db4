//! A small metric model and the Prometheus text exposition format (0.0.4).
//!
//! Collectors emit many series per job; rendering each job's label block once and sharing it
//! across families keeps a scrape to a handful of allocations per job (see `benches/scrape.rs`).

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
        if pairs.is_empty() {
            return Labels::empty();
        }
        // Sized exactly (values needing no escape are the rule) and sorted only when not
        // already: a unit collector builds one for each of a thousand jobs per scrape.
        let len = pairs
            .iter()
            .map(|(name, value)| name.len() + value.len() + 4)
            .sum::<usize>()
            + 1;
        let mut out = String::with_capacity(len);
        out.push('{');
        let mut push = |i: usize, (name, value): &(&str, &str)| {
            if i > 0 {
                out.push(',');
            }
            out.push_str(name);
            out.push_str("=\"");
            escape_label_value(value, &mut out);
            out.push('"');
        };
        if pairs.windows(2).all(|w| w[0].0 <= w[1].0) {
            pairs.iter().enumerate().for_each(|(i, p)| push(i, p));
        } else {
            let mut sorted: Vec<&(&str, &str)> = pairs.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(b.0));
            sorted.into_iter().enumerate().for_each(|(i, p)| push(i, p));
        }
        out.push('}');
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
    if !value.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        out.push_str(value);
        return;
    }
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
#[derive(Debug, Default, Clone)]
pub struct MetricSet {
    families: Vec<Family>,
    /// Address and length of the name each family was last asked by. Emitters pass the same
    /// constants for thousands of units, and most names share a long `ceems_compute_unit_`
    /// prefix: two integers say where to look, one comparison confirms.
    asked_as: Vec<(usize, usize)>,
    /// Room for this many samples in each family made from now on: see
    /// [`MetricSet::expect_samples`].
    expected: usize,
}

impl MetricSet {
    /// Families made from now on get room for `n` samples at once: a collector about to emit
    /// a series per unit for a thousand units spares each family ten reallocations and copies.
    /// 0 goes back to growing as needed.
    pub fn expect_samples(&mut self, n: usize) {
        self.expected = n;
    }

    pub fn new() -> MetricSet {
        MetricSet::default()
    }

    /// Returns the family named `name`, creating it on first use.
    pub fn family(&mut self, name: &str, help: &str, kind: MetricType) -> &mut Family {
        // Families per collector are few, so a linear search beats hashing.
        let key = (name.as_ptr() as usize, name.len());
        let idx = match self.asked_as.iter().position(|k| *k == key) {
            Some(i) if self.families[i].name == name => i,
            _ => match self.families.iter().position(|f| f.name == name) {
                Some(i) => {
                    self.asked_as[i] = key;
                    i
                }
                None => {
                    self.families.push(Family {
                        name: name.to_owned(),
                        help: help.to_owned(),
                        kind,
                        samples: Vec::with_capacity(self.expected),
                    });
                    self.asked_as.push(key);
                    self.families.len() - 1
                }
            },
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
                None => {
                    self.families.push(fam);
                    self.asked_as.push((0, 0));
                }
            }
        }
    }

    pub fn families(&self) -> &[Family] {
        &self.families
    }

    pub fn len_samples(&self) -> usize {
        self.families.iter().map(|f| f.samples.len()).sum()
    }

    /// About how long [`MetricSet::encode_text`]'s output is, a little over rather than under:
    /// a scrape's body is reserved once instead of grown (and copied) by doubling.
    pub fn encoded_len_hint(&self) -> usize {
        self.families
            .iter()
            .map(|f| {
                let header = 2 * f.name.len() + f.help.len() + 32;
                let lines: usize = f
                    .samples
                    .iter()
                    .map(|s| f.name.len() + s.labels.as_str().len() + 26)
                    .sum();
                header + lines
            })
            .sum()
    }

    /// Encodes in the text format, families sorted by name and samples by labels, so the output
    /// is stable from one scrape to the next.
    pub fn encode_text(mut self, out: &mut String) {
        self.families.sort_by(|a, b| a.name.cmp(&b.name));
        let mut order = SampleOrder::default();
        for fam in &self.families {
            order.sort(&fam.samples);
            out.push_str("# HELP ");
            out.push_str(&fam.name);
            out.push(' ');
            escape_help(&fam.help, out);
            out.push_str("\n# TYPE ");
            out.push_str(&fam.name);
            out.push(' ');
            out.push_str(fam.kind.as_str());
            out.push('\n');
            for s in order.perm.iter().map(|&i| &fam.samples[i]) {
                out.push_str(&fam.name);
                out.push_str(s.labels.as_str());
                out.push(' ');
                format_float(s.value, out);
                out.push('\n');
            }
        }
    }
}

/// The order of a family's samples by labels. A collector gives its units' families the
/// same label blocks in the same order, so the order found for one family is reused for the
/// next when the blocks are the very same ones: sorting thousands of long label blocks once
/// per family was a tenth of a scrape's user time.
#[derive(Default)]
struct SampleOrder {
    /// The label blocks of the family last sorted, as pushed, by address.
    blocks: Vec<*const u8>,
    /// Indices into that family's samples, in label order.
    perm: Vec<usize>,
}

impl SampleOrder {
    fn sort(&mut self, samples: &[Sample]) {
        // Addresses of blocks that live until the whole set is encoded: equal addresses are
        // the same block, never a freed one reused.
        let same = samples.len() == self.blocks.len()
            && samples
                .iter()
                .zip(&self.blocks)
                .all(|(s, b)| s.labels.0.as_ptr() == *b);
        if same {
            return;
        }
        self.blocks.clear();
        self.blocks
            .extend(samples.iter().map(|s| s.labels.0.as_ptr()));
        self.perm.clear();
        self.perm.extend(0..samples.len());
        self.perm
            .sort_by(|&a, &b| samples[a].labels.cmp(&samples[b].labels));
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
    let mut int_digits = [0u8; 20];
    let (digits, exp): (&[u8], i32) = if v.fract() == 0.0 && v.abs() < 1e15 {
        // Most values are counts of bytes or ticks. Below 1e15 neighbouring floats are less
        // than 1 apart, so an integer's own digits are its shortest round-trip form.
        let mut n = v.abs() as u64;
        let mut start = int_digits.len();
        while n > 0 {
            start -= 1;
            int_digits[start] = b'0' + (n % 10) as u8;
            n /= 10;
        }
        let all = &int_digits[start..];
        let end = all.iter().rposition(|d| *d != b'0').map_or(1, |p| p + 1);
        (&all[..end], all.len() as i32 - 1)
    } else {
        let (len, exp) = shortest_digits(v.abs(), &mut int_digits);
        (&int_digits[..len], exp)
    };
    if v < 0.0 {
        out.push('-');
    }
    // Only ASCII digits reach here.
    let push = |out: &mut String, ds: &[u8]| out.push_str(std::str::from_utf8(ds).unwrap_or(""));
    const EPREC: i32 = 6;
    if !(-4..EPREC).contains(&exp) {
        push(out, &digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            push(out, &digits[1..]);
        }
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        // At least two digits, as Go writes them; a float's exponent has at most three.
        let abs = exp.unsigned_abs();
        let digit = |d: u32| char::from(b'0' + (d % 10) as u8);
        if abs >= 100 {
            out.push(digit(abs / 100));
        }
        out.push(digit(abs / 10));
        out.push(digit(abs));
    } else if exp < 0 {
        out.push_str("0.");
        for _ in 0..(-exp - 1) {
            out.push('0');
        }
        push(out, digits);
    } else {
        let int_len = (exp + 1) as usize;
        if digits.len() <= int_len {
            push(out, digits);
            for _ in digits.len()..int_len {
                out.push('0');
            }
        } else {
            push(out, &digits[..int_len]);
            out.push('.');
            push(out, &digits[int_len..]);
        }
    }
}

/// The shortest digits that read back as `v` (finite, positive), written into `digits`, and
/// the decimal exponent of the first: (digits written, exponent).
fn shortest_digits(v: f64, digits: &mut [u8; 20]) -> (usize, i32) {
    // Ryu gives the shortest round-trip digits (of two equally near, the even one, as Go's
    // strconv), written as "123.456", "0.00123", "1.5e-7" or "1e20": read here as digits and
    // where the point falls. Rust's `{:e}` costs several times more, and rounds such ties up.
    let mut ryu = ryu::Buffer::new();
    let text = ryu.format_finite(v);
    let (mantissa, exp10) = match text.split_once('e') {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (text, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mut at = 0;
    let mut leading_zeros = 0;
    for d in int_part.bytes().chain(frac_part.bytes()) {
        if at == 0 && d == b'0' {
            leading_zeros += 1;
        } else if at < digits.len() {
            digits[at] = d;
            at += 1;
        }
    }
    while at > 1 && digits[at - 1] == b'0' {
        at -= 1;
    }
    let exp = exp10 + int_part.len() as i32 - 1 - leading_zeros;
    (at.max(1), exp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prop_assert_eq;

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
        assert_eq!(f(-21086208.0), "-2.1086208e+07");
        assert_eq!(f(123456.0), "123456");
        assert_eq!(f(999999999999999.0), "9.99999999999999e+14");
        assert_eq!(f(1e15), "1e+15");
        assert_eq!(f(-0.5e-7), "-5e-08");
        assert_eq!(f(1e100), "1e+100");
        assert_eq!(f(5e-324), "5e-324");
        assert_eq!(f(1.5e-10), "1.5e-10");
        // Exactly halfway between ...202 and ...203: the even one, as Go's strconv writes it.
        // (1009985421796820.25 exactly, which clippy will not have written out.)
        let tie = f64::from_bits(4_831_435_084_288_175_778);
        assert_eq!(f(tie), "1.0099854217968202e+15");
    }

    proptest::proptest! {
        /// For any finite float, as many digits as Rust's own shortest `{:e}` and the same
        /// value read back. (Where two such digit strings are equally near, Ryu takes the even
        /// one, as Go does; `{:e}` rounded up.)
        #[test]
        fn shortest_digits_are_shortest_and_read_back(bits in proptest::num::u64::ANY) {
            let v = f64::from_bits(bits).abs();
            proptest::prop_assume!(v.is_finite() && v > 0.0);
            let sci = format!("{v:e}");
            let (mantissa, _) = sci.split_once('e').unwrap();
            let shortest = mantissa.chars().filter(|c| *c != '.').count();
            let mut digits = [0u8; 20];
            let (len, exp) = shortest_digits(v, &mut digits);
            prop_assert_eq!(len, shortest);
            let text = format!("0.{}e{}", std::str::from_utf8(&digits[..len]).unwrap(), exp + 1);
            prop_assert_eq!(text.parse::<f64>().ok(), Some(v));
        }
    }

    proptest::proptest! {
        /// Whatever path formats it, the text reads back as the same float.
        #[test]
        fn floats_round_trip(v in proptest::num::f64::NORMAL, n in 0u64..2_000_000_000_000_000) {
            for x in [v, n as f64, -(n as f64)] {
                prop_assert_eq!(f(x).parse::<f64>().ok(), Some(x));
            }
        }
    }

    #[test]
    fn labels_are_sorted_and_escaped() {
        let l = Labels::new(&[("uuid", "a\"b"), ("hostname", "x\\y\nz")]);
        assert_eq!(l.as_str(), r#"{hostname="x\\y\nz",uuid="a\"b"}"#);
        assert_eq!(Labels::new(&[]).as_str(), "");
    }

    #[test]
    fn the_length_hint_covers_the_longest_values_without_wasting_much() {
        let mut set = MetricSet::new();
        for i in 0..1000 {
            let labels = Labels::new(&[("hostname", "node-1"), ("uuid", &i.to_string())]);
            set.gauge(
                "a_gauge",
                "A.",
                labels.clone(),
                -1.234_567_890_123_456_7e-300,
            );
            set.counter("b_total", "B.", labels, f64::from(i));
        }
        let hint = set.encoded_len_hint();
        let mut text = String::new();
        set.encode_text(&mut text);
        assert!(hint >= text.len(), "{hint} < {}", text.len());
        assert!(hint < text.len() * 3 / 2, "{hint} for {}", text.len());
    }

    #[test]
    fn families_sharing_label_blocks_and_families_of_others_are_each_sorted() {
        let mut set = MetricSet::new();
        let units: Vec<Labels> = ["3", "1", "2"]
            .iter()
            .map(|u| Labels::new(&[("uuid", u)]))
            .collect();
        for (i, labels) in units.iter().enumerate() {
            set.gauge("a", "A.", labels.clone(), i as f64);
            set.gauge("b", "B.", labels.clone(), 10.0 + i as f64);
        }
        // As many samples as the families before, but other blocks in another order.
        for u in ["9", "7", "8"] {
            set.gauge("c", "C.", Labels::new(&[("uuid", u)]), 0.0);
        }
        let mut out = String::new();
        set.encode_text(&mut out);
        let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            [
                r#"a{uuid="1"} 1"#,
                r#"a{uuid="2"} 2"#,
                r#"a{uuid="3"} 0"#,
                r#"b{uuid="1"} 11"#,
                r#"b{uuid="2"} 12"#,
                r#"b{uuid="3"} 10"#,
                r#"c{uuid="7"} 0"#,
                r#"c{uuid="8"} 0"#,
                r#"c{uuid="9"} 0"#,
            ]
        );
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
