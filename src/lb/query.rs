//! Which compute units a PromQL expression can read: the `uuid` matchers of every selector in
//! it, however deep (subqueries, `label_replace`, binary operations). A selector without a
//! `uuid="…"` or `uuid=~"a|b"` matcher can read any unit, so the expression is unscoped.

use std::collections::BTreeSet;

use promql_parser::label::{MatchOp, Matcher, Matchers};
use promql_parser::parser::{self, Expr, VectorSelector};

/// The label that names a compute unit.
pub const UNIT_LABEL: &str = "uuid";

/// The label that names a unit's cluster, where the stores keep several.
pub const CLUSTER_LABEL: &str = "ceems_id";

/// What an expression reads: its units, and the clusters its selectors name with
/// `ceems_id="…"` (none when they name none).
#[derive(Debug, Default, PartialEq)]
pub struct Scope {
    pub units: BTreeSet<String>,
    pub clusters: BTreeSet<String>,
    /// How far from its evaluation time it reads, from the same parse.
    pub reach: Reach,
}

impl Scope {
    /// Adds what `other` reads.
    pub fn extend(&mut self, other: Scope) {
        self.units.extend(other.units);
        self.clusters.extend(other.clusters);
        self.reach.from = self.reach.from.min(other.reach.from);
        self.reach.to = self.reach.to.max(other.reach.to);
        self.reach.anchored.extend(other.reach.anchored);
    }
}

/// Longest expression analysed (Grafana's longest, a regex of a few hundred job ids, is a few
/// KiB); also bounds the parser's and the tree's work.
pub const MAX_QUERY_BYTES: usize = 64 << 10;

/// Deepest nesting of brackets analysed: deeper trees would cost stack to walk and to drop.
const MAX_DEPTH: usize = 128;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ScopeError {
    #[error("the query is {0} bytes long; at most {MAX_QUERY_BYTES} are accepted")]
    TooLong(usize),
    #[error("the query nests brackets deeper than {MAX_DEPTH}")]
    TooDeep,
    #[error("not a PromQL expression: {0}")]
    Parse(String),
    #[error("`{0}` names no unit: add {1}=\"<job id>\"")]
    Unscoped(String, &'static str),
    #[error(
        "uuid=~\"{0}\" is not a list of unit ids (a|b|c); a pattern could match others' units"
    )]
    Pattern(String),
    #[error("a series selector must be a selector such as {{uuid=\"<job id>\"}}, not `{0}`")]
    NotASelector(String),
}

/// The units `query` reads, when every selector in it names its units; an expression with no
/// selector at all (`time()`) names none.
pub fn scope_of_query(query: &str) -> Result<Scope, ScopeError> {
    let expr = parse(query)?;
    let mut scope = Scope::default();
    // An explicit stack: the walk costs no call depth whatever the tree.
    let mut stack: Vec<&Expr> = vec![&expr];
    while let Some(e) = stack.pop() {
        match e {
            Expr::Aggregate(a) => {
                stack.push(&a.expr);
                stack.extend(a.param.as_deref());
            }
            Expr::Unary(u) => stack.push(&u.expr),
            Expr::Binary(b) => {
                stack.push(&b.lhs);
                stack.push(&b.rhs);
            }
            Expr::Paren(p) => stack.push(&p.expr),
            Expr::Subquery(s) => stack.push(&s.expr),
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) => {}
            Expr::VectorSelector(vs) => add_selector(&mut scope, vs, UNIT_LABEL)?,
            Expr::MatrixSelector(ms) => add_selector(&mut scope, &ms.vs, UNIT_LABEL)?,
            Expr::Call(c) => stack.extend(c.args.args.iter().map(|a| a.as_ref())),
            // The parser never makes one; one we cannot look into is refused.
            Expr::Extension(_) => return Err(ScopeError::NotASelector("an extension".into())),
        }
    }
    scope.reach = reach_of_expr(&expr);
    Ok(scope)
}

fn add_selector(
    scope: &mut Scope,
    vs: &VectorSelector,
    unit_label: &'static str,
) -> Result<(), ScopeError> {
    scope.units.extend(selector_units(vs, unit_label)?);
    let all = vs
        .matchers
        .matchers
        .iter()
        .chain(vs.matchers.or_matchers.iter().flatten());
    scope.clusters.extend(
        all.filter(|m| m.name == CLUSTER_LABEL && m.op == MatchOp::Equal)
            .map(|m| m.value.clone()),
    );
    Ok(())
}

/// The units a series selector (`match[]` of `/api/v1/series`, `/labels`, label values) reads.
pub fn scope_of_selector(selector: &str) -> Result<Scope, ScopeError> {
    scope_of_labelled_selector(selector, UNIT_LABEL)
}

/// The units a selector names with `unit_label` (Pyroscope's label selectors name a job's
/// profiles with `service_name`). Pyroscope's match-all `{}` names none.
pub fn scope_of_labelled_selector(
    selector: &str,
    unit_label: &'static str,
) -> Result<Scope, ScopeError> {
    let bare: String = selector.chars().filter(|c| !c.is_whitespace()).collect();
    if bare.is_empty() || bare == "{}" {
        return Err(ScopeError::Unscoped(shorten(selector), unit_label));
    }
    match parse(selector)? {
        Expr::VectorSelector(vs) => {
            let mut scope = Scope::default();
            add_selector(&mut scope, &vs, unit_label)?;
            Ok(scope)
        }
        other => Err(ScopeError::NotASelector(shorten(&other.to_string()))),
    }
}

fn parse(query: &str) -> Result<Expr, ScopeError> {
    if query.len() > MAX_QUERY_BYTES {
        return Err(ScopeError::TooLong(query.len()));
    }
    if nesting(query) > MAX_DEPTH {
        return Err(ScopeError::TooDeep);
    }
    // promql-parser 0.11 panics on some number literals (a duration too large for
    // `Duration::from_secs_f64`, found by fuzzing): a query must not take the server down.
    match std::panic::catch_unwind(|| parser::parse(query)) {
        Ok(parsed) => parsed.map_err(|e| ScopeError::Parse(shorten(&e))),
        Err(_) => Err(ScopeError::Parse(
            "the PromQL parser gave up on this query (a number out of range?)".into(),
        )),
    }
}

/// Deepest bracket nesting outside string literals.
fn nesting(query: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut quote: Option<char> = None;
    let mut chars = query.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(_), '\\') => {
                chars.next();
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'' | '`') => quote = Some(c),
            (None, '(' | '[' | '{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (None, ')' | ']' | '}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The units of one selector: each of its alternative matcher sets (`{a="1" or b="2"}`) must
/// name its units.
fn selector_units(
    vs: &VectorSelector,
    unit_label: &'static str,
) -> Result<BTreeSet<String>, ScopeError> {
    let Matchers {
        matchers,
        or_matchers,
    } = &vs.matchers;
    let mut sets: Vec<&Vec<Matcher>> = or_matchers.iter().collect();
    if sets.is_empty() || !matchers.is_empty() {
        sets.push(matchers);
    }
    let mut units = BTreeSet::new();
    for set in sets {
        let mut named = false;
        for m in set.iter().filter(|m| m.name == unit_label) {
            match &m.op {
                MatchOp::Equal if !m.value.is_empty() => {
                    units.insert(m.value.clone());
                    named = true;
                }
                MatchOp::Re(_) => {
                    units.extend(literal_alternatives(&m.value)?);
                    named = true;
                }
                // `uuid!=…`, `uuid!~…` and `uuid=""` select other units, not these.
                _ => {}
            }
        }
        if !named {
            return Err(ScopeError::Unscoped(shorten(&vs.to_string()), unit_label));
        }
    }
    Ok(units)
}

/// `a|b|c` of literal ids (metacharacters escaped with `\` are literal), as Prometheus anchors
/// it: exactly these ids. Anything that could match another string is refused.
pub fn literal_alternatives(pattern: &str) -> Result<Vec<String>, ScopeError> {
    let refuse = || ScopeError::Pattern(shorten(pattern));
    let mut ids = Vec::new();
    let mut id = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e) if e.is_ascii_punctuation() => id.push(e),
                _ => return Err(refuse()),
            },
            '|' => {
                if id.is_empty() {
                    return Err(refuse());
                }
                ids.push(std::mem::take(&mut id));
            }
            c if c.is_alphanumeric() || matches!(c, '_' | '-' | ':' | '/' | '@' | ',' | '=') => {
                id.push(c)
            }
            _ => return Err(refuse()),
        }
    }
    if id.is_empty() {
        return Err(refuse());
    }
    ids.push(id);
    Ok(ids)
}

/// Error messages quote at most this much of what they refuse.
/// How far from its evaluation time an expression reads, in seconds: `[t + from, t + to]`
/// (ranges, offsets, subqueries), and the absolute intervals its `@ <time>` modifiers read.
/// An instant selector's lookback is not counted: Prometheus marks a series stale at the
/// first scrape without it, so it does not read across the gap between two jobs.
#[derive(Debug, Default, PartialEq)]
pub struct Reach {
    pub from: f64,
    pub to: f64,
    pub anchored: Vec<(f64, f64)>,
}

/// The reach of `query` (an expression [`scope_of_query`] accepted; its scope carries it).
pub fn reach_of_query(query: &str) -> Result<Reach, ScopeError> {
    Ok(reach_of_expr(&parse(query)?))
}

fn reach_of_expr(expr: &Expr) -> Reach {
    use promql_parser::parser::{AtModifier, Offset};
    let mut reach = Reach::default();
    let seconds = |d: &std::time::Duration| d.as_secs_f64();
    let shift = |offset: &Option<Offset>| match offset {
        Some(Offset::Pos(d)) => -seconds(d),
        Some(Offset::Neg(d)) => seconds(d),
        None => 0.0,
    };
    // Each node with the interval it is evaluated over, relative to its anchor, and that
    // anchor: the query's time, or an `@` time.
    let mut stack: Vec<(&Expr, (f64, f64), Option<f64>)> = vec![(expr, (0.0, 0.0), None)];
    let mut add = |interval: (f64, f64), anchor: Option<f64>| match anchor {
        None => {
            reach.from = reach.from.min(interval.0);
            reach.to = reach.to.max(interval.1);
        }
        Some(at) => reach.anchored.push((at + interval.0, at + interval.1)),
    };
    let anchor_of = |at: &Option<AtModifier>, anchor: Option<f64>| match at {
        Some(AtModifier::At(time)) => Some(match time.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => d.as_secs_f64(),
            Err(e) => -e.duration().as_secs_f64(),
        }),
        // `@ start()` and `@ end()` are within the query's own range.
        _ => anchor,
    };
    while let Some((e, (lo, hi), anchor)) = stack.pop() {
        let at = |vs: &VectorSelector, back: f64| {
            let s = shift(&vs.offset);
            match &vs.at {
                Some(AtModifier::At(_)) => ((s - back, s), anchor_of(&vs.at, anchor)),
                _ => ((lo + s - back, hi + s), anchor),
            }
        };
        match e {
            Expr::VectorSelector(vs) => {
                let (interval, anchor) = at(vs, 0.0);
                add(interval, anchor);
            }
            Expr::MatrixSelector(ms) => {
                let (interval, anchor) = at(&ms.vs, seconds(&ms.range));
                add(interval, anchor);
            }
            Expr::Subquery(sq) => {
                let s = shift(&sq.offset);
                let range = seconds(&sq.range);
                let inner = match &sq.at {
                    Some(AtModifier::At(_)) => ((s - range, s), anchor_of(&sq.at, anchor)),
                    _ => ((lo + s - range, hi + s), anchor),
                };
                stack.push((&sq.expr, inner.0, inner.1));
            }
            Expr::Aggregate(a) => {
                stack.push((&a.expr, (lo, hi), anchor));
                if let Some(p) = a.param.as_deref() {
                    stack.push((p, (lo, hi), anchor));
                }
            }
            Expr::Unary(u) => stack.push((&u.expr, (lo, hi), anchor)),
            Expr::Binary(b) => {
                stack.push((&b.lhs, (lo, hi), anchor));
                stack.push((&b.rhs, (lo, hi), anchor));
            }
            Expr::Paren(p) => stack.push((&p.expr, (lo, hi), anchor)),
            Expr::Call(c) => {
                stack.extend(c.args.args.iter().map(|a| (a.as_ref(), (lo, hi), anchor)))
            }
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
        }
    }
    reach
}

fn shorten(text: &str) -> String {
    const MAX: usize = 200;
    match text.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reach_of_ranges_offsets_subqueries_and_at() {
        let r = |q: &str| reach_of_query(q).unwrap();
        assert_eq!(r(r#"x{uuid="1"}"#), Reach::default());
        assert_eq!(r(r#"rate(x{uuid="1"}[1h])"#).from, -3600.0);
        assert_eq!(r(r#"rate(x{uuid="1"}[1h] offset 1d)"#).from, -90000.0);
        assert_eq!(r(r#"x{uuid="1"} offset -1h"#).to, 3600.0);
        // A subquery's range and the selector's inside it add up.
        assert_eq!(
            r(r#"max_over_time(rate(x{uuid="1"}[5m])[1d:1m])"#).from,
            -86400.0 - 300.0
        );
        let at = r(r#"rate(x{uuid="1"}[5m] @ 1000) + y{uuid="1"}"#);
        assert_eq!(at.anchored, [(700.0, 1000.0)]);
        assert_eq!((at.from, at.to), (0.0, 0.0));
        assert_eq!(r(r#"x{uuid="1"} @ end()"#).anchored, []);
        assert!(reach_of_query("sum((").is_err());
    }

    fn units(q: &str) -> Vec<String> {
        scope_of_query(q)
            .unwrap_or_else(|e| panic!("{q}: {e}"))
            .units
            .into_iter()
            .collect()
    }

    fn units_of_query(q: &str) -> Result<BTreeSet<String>, ScopeError> {
        scope_of_query(q).map(|s| s.units)
    }

    #[test]
    fn clusters_named_by_ceems_id() {
        let scope = scope_of_query(r#"a{uuid="1",ceems_id="slurm-0"} + b{uuid="2"}"#).unwrap();
        assert_eq!(scope.clusters.into_iter().collect::<Vec<_>>(), ["slurm-0"]);
    }

    #[test]
    fn every_selector_anywhere_in_the_tree_counts() {
        assert_eq!(
            units(r#"rate(ceems_compute_unit_cpu_user_seconds_total{uuid="123"}[1m])"#),
            ["123"]
        );
        assert_eq!(
            units(r#"sum(rate(a{uuid=~"1|2"}[5m])) / on(uuid) b{uuid="3"}"#),
            ["1", "2", "3"]
        );
        // Hidden in a subquery, a label_replace, an aggregation's parameter.
        assert_eq!(
            units(r#"max_over_time(rate(a{uuid="1"}[1m])[10m:1m])"#),
            ["1"]
        );
        assert_eq!(
            units(r#"label_replace(a{uuid="1"}, "x", "$1", "uuid", "(.*)") or b{uuid="2"}"#),
            ["1", "2"]
        );
        assert_eq!(
            units(r#"topk(scalar(c{uuid="9"}), a{uuid="1"})"#),
            ["1", "9"]
        );
        assert!(units("time() + 1").is_empty());
    }

    #[test]
    fn a_selector_that_could_read_any_unit_is_refused() {
        for q in [
            r#"a{uuid="1"} + b"#,
            r#"a{uuid!="1"}"#,
            r#"a{uuid!~"1|2"}"#,
            r#"a{uuid=""}"#,
            r#"{__name__=~".+"}"#,
            r#"label_replace(a{uuid="1"}, "x", "", "", "") * on() group_left b{job="x"}"#,
            r#"max_over_time(b[5m:1m])"#,
        ] {
            assert!(
                matches!(units_of_query(q), Err(ScopeError::Unscoped(..))),
                "{q}: {:?}",
                units_of_query(q)
            );
        }
    }

    #[test]
    fn unit_patterns_must_be_lists_of_ids() {
        assert_eq!(
            literal_alternatives("1|22|333").unwrap(),
            ["1", "22", "333"]
        );
        assert_eq!(literal_alternatives(r"12\[3\]").unwrap(), ["12[3]"]);
        assert_eq!(
            literal_alternatives("4b0a2c5e-7f00-4e3a-9b1f-2d3c4e5f6a7b").unwrap(),
            ["4b0a2c5e-7f00-4e3a-9b1f-2d3c4e5f6a7b"]
        );
        for p in [
            "1.*", ".+", "1|", "|1", "1||2", "(1|2)", "1?", "[12]", "(?i)a", r"\d+", "",
        ] {
            assert!(literal_alternatives(p).is_err(), "{p}");
        }
        assert!(matches!(
            units_of_query(r#"a{uuid=~"alice_job|.*"}"#),
            Err(ScopeError::Pattern(_))
        ));
    }

    #[test]
    fn series_selectors() {
        assert_eq!(
            scope_of_selector(r#"{uuid="7"}"#)
                .unwrap()
                .units
                .into_iter()
                .collect::<Vec<_>>(),
            ["7"]
        );
        assert!(matches!(
            scope_of_selector(r#"rate(a{uuid="7"}[1m])"#),
            Err(ScopeError::NotASelector(_))
        ));
        assert!(matches!(
            scope_of_selector("up"),
            Err(ScopeError::Unscoped(..))
        ));
    }

    #[test]
    fn a_parser_panic_is_an_error() {
        // The fuzzer's find: a range in seconds too long for a Duration.
        let q = format!("a{{uuid=\"1\"}}[{}]", "6".repeat(70));
        assert!(matches!(scope_of_query(&q), Err(ScopeError::Parse(_))));
    }

    #[test]
    fn malformed_long_and_deep_queries_are_errors() {
        assert!(matches!(units_of_query("sum(("), Err(ScopeError::Parse(_))));
        assert!(matches!(
            units_of_query(&"a".repeat(MAX_QUERY_BYTES + 1)),
            Err(ScopeError::TooLong(_))
        ));
        let deep = format!("{}a{{uuid=\"1\"}}{}", "(".repeat(500), ")".repeat(500));
        assert_eq!(units_of_query(&deep), Err(ScopeError::TooDeep));
        // Brackets inside strings do not count.
        let quoted = format!("a{{uuid=\"1\", x=\"{}\"}}", "(".repeat(500));
        assert_eq!(units(&quoted), ["1"]);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// PromQL wrappers a query can hide a selector in.
        fn wrap(inner: String, how: u8) -> String {
            match how % 9 {
                0 => format!("rate(b{{uuid=\"1\"}}[5m]) + {inner}"),
                1 => format!("sum by (uuid) ({inner})"),
                2 => format!("max_over_time(({inner})[10m:1m])"),
                3 => format!(r#"label_replace({inner}, "x", "$1", "uuid", "(.*)")"#),
                4 => format!("({inner}) * on(uuid) group_left a{{uuid=\"1\"}}"),
                5 => format!("topk(2, {inner})"),
                6 => format!("-({inner})"),
                7 => format!("{inner} or vector(0)"),
                _ => format!("clamp_min({inner}, scalar(c{{uuid=\"1\"}} offset 5m))"),
            }
        }

        proptest! {
            /// Whatever it is wrapped in, a selector of another unit is always found.
            #[test]
            fn a_foreign_unit_cannot_hide(hows in proptest::collection::vec(any::<u8>(), 0..6), id in 2u32..10_000) {
                let mut q = format!("a{{uuid=\"{id}\"}}");
                for how in hows {
                    q = wrap(q, how);
                }
                let scope = scope_of_query(&q);
                prop_assert!(
                    scope.as_ref().is_ok_and(|s| s.units.contains(&id.to_string())),
                    "{q}: {scope:?}"
                );
            }

            /// Arbitrary text is an answer or an error, never a panic.
            #[test]
            fn any_text_is_analysed_without_panicking(text in ".{0,200}") {
                let _ = scope_of_query(&text);
                let _ = scope_of_selector(&text);
                let _ = literal_alternatives(&text);
            }
        }
    }
}
