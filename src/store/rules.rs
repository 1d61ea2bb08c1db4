//! Findings a site writes itself: `[[stats-server.finding-rules]]`, each a CEL condition over
//! a job's summary (`job.…`), a severity, and a message and advice with `{…}` placeholders
//! (CEL expressions too). Checked whole at load: a rule that does not parse, names a field a
//! job does not have, or calls an unknown function is refused with where it is written.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, RwLock};

use cel::common::ast::{EntryExpr, Expr};
use cel::objects::Key;
use cel::{Context, IdedExpr, Program, Value};
use serde::Deserialize;

use crate::store::db::measured;
use crate::store::findings::{Finding, JobFacts, Severity};

/// A rule as the config file spells it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RuleConfig {
    id: String,
    #[serde(default = "default_severity")]
    severity: Severity,
    when: String,
    message: String,
    #[serde(default)]
    advice: String,
}

fn default_severity() -> Severity {
    Severity::Warning
}

/// Why a rule was refused.
#[derive(Debug, thiserror::Error)]
#[error("{location}{key}: {reason}")]
pub struct RuleError {
    /// `config file … line N: ` where the rule's text was found in the file, or empty.
    location: String,
    /// `finding-rules[1].when`, as the other keys are named.
    key: String,
    reason: String,
}

/// The fields of `job`, as [`field`] makes them (a test keeps the two alike).
pub const JOB_FIELDS: &[&str] = &[
    "manager",
    "name",
    "user",
    "project",
    "partition",
    "qos",
    "nodes",
    "node_count",
    "node_cpu_seconds",
    "state",
    "exit_code",
    "ended",
    "elapsed_seconds",
    "time_limit_seconds",
    "alloc_cpus",
    "alloc_mem_bytes",
    "alloc_gpus",
    "aggregated_seconds",
    "cpu_seconds",
    "cpu_cores_used",
    "cpu_efficiency",
    "memory_peak_bytes",
    "memory_use_percent",
    "memory_fail_count",
    "gpu_utilization_mean",
    "gpu_utilization_max",
    "gpu_memory_peak_bytes",
    "host_energy_joules",
    "gpu_energy_joules",
    "emissions_grams",
];

/// Functions a rule's text may call beside CEL's own: sizes and times in words, and the
/// manager's request for an amount (`--mem=18G`, `bsub -W 2:00`).
const OWN_FUNCTIONS: &[&str] = &[
    "human_bytes",
    "human_duration",
    "memory_request",
    "time_request",
];

/// CEL's standard functions and operators (the parser's `_&&_`-style names are operators).
const CEL_FUNCTIONS: &[&str] = &[
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "has",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "type",
    "max",
    "min",
    "all",
    "exists",
    "exists_one",
    "map",
    "filter",
    "dyn",
    "bytes",
    "@in",
    "@not_strictly_false",
];

/// Field `name` of `job`, as a rule sees it: base units and percent; a figure Prometheus never
/// gave is `null`, and a comparison with `null` is an error, so such a rule does not fire.
fn field(job: &JobFacts, name: &str) -> Value {
    let seen = |bit| measured::has(job.measured, bit);
    let cores_used = job.cores_used();
    let text = |s: &str| Value::from(s.to_owned());
    let real = |v: Option<f64>| v.map_or(Value::Null, Value::Float);
    match name {
        "manager" => text(&job.manager),
        "name" => text(&job.name),
        "user" => text(&job.user),
        "project" => text(&job.project),
        "partition" => text(&job.partition),
        "qos" => text(&job.qos),
        "nodes" => text(&job.nodes),
        "node_count" => Value::Int(job.node_count() as i64),
        "node_cpu_seconds" if job.node_cpu_seconds.is_empty() => Value::Null,
        "node_cpu_seconds" => Value::from(
            job.node_cpu_seconds
                .iter()
                .map(|(n, s)| (n.clone(), Value::Float(*s)))
                .collect::<std::collections::HashMap<String, Value>>(),
        ),
        "state" => text(&job.state),
        "exit_code" => text(&job.exit_code),
        "ended" => Value::Bool(job.ended),
        "elapsed_seconds" => Value::Int(job.elapsed_seconds),
        "time_limit_seconds" => job.time_limit_seconds.map_or(Value::Null, Value::Int),
        "alloc_cpus" => Value::Int(job.alloc_cpus),
        "alloc_mem_bytes" => Value::Int(job.alloc_mem_bytes),
        "alloc_gpus" => Value::Int(job.alloc_gpus),
        "aggregated_seconds" => Value::Int(job.aggregated_seconds),
        "cpu_seconds" => real(seen(measured::CPU).then_some(job.cpu_seconds)),
        "cpu_cores_used" => real(cores_used),
        "cpu_efficiency" => real(
            cores_used
                .filter(|_| job.alloc_cpus > 0)
                .map(|used| 100.0 * used / job.alloc_cpus as f64),
        ),
        "memory_peak_bytes" => real(job.memory_peak_bytes),
        "memory_use_percent" => real(
            job.memory_peak_bytes
                .filter(|_| job.alloc_mem_bytes > 0)
                .map(|peak| 100.0 * peak / job.alloc_mem_bytes as f64),
        ),
        "memory_fail_count" => real(job.memory_fail_count),
        "gpu_utilization_mean" => real(
            job.gpu_utilization_max
                .and(job.mean_gpu_utilization)
                .map(|m| 100.0 * m),
        ),
        "gpu_utilization_max" => real(job.gpu_utilization_max.map(|m| 100.0 * m)),
        "gpu_memory_peak_bytes" => real(job.gpu_memory_peak_bytes),
        "host_energy_joules" => real(seen(measured::HOST_ENERGY).then_some(job.host_energy_joules)),
        "gpu_energy_joules" => real(seen(measured::GPU_ENERGY).then_some(job.gpu_energy_joules)),
        "emissions_grams" => real(seen(measured::EMISSIONS).then_some(job.emissions_grams)),
        _ => Value::Null,
    }
}

/// `job` as a CEL map of the fields in `used` only: building all of them for every job was
/// most of what a rule cost.
fn job_value(job: &JobFacts, used: &[&'static str]) -> Value {
    let map: std::collections::HashMap<Key, Value> = used
        .iter()
        .map(|name| (Key::from(*name), field(job, name)))
        .collect();
    Value::Map(cel::objects::Map { map: Arc::new(map) })
}

/// The fields of `job` the rules read; all of them where one hands `job` itself around.
#[derive(Debug, Default)]
struct Usage {
    fields: std::collections::BTreeSet<&'static str>,
    whole: bool,
}

/// A message or advice: text and CEL expressions in turn.
#[derive(Debug)]
enum Piece {
    Text(String),
    Expr(Program),
}

#[derive(Debug)]
struct Template(Vec<Piece>);

/// One rule, compiled.
#[derive(Debug)]
pub struct SiteRule {
    pub id: String,
    pub severity: Severity,
    when: Program,
    message: Template,
    advice: Template,
}

/// The site's rules, compiled; empty when the file has none.
#[derive(Debug, Default)]
pub struct SiteRules {
    rules: Vec<SiteRule>,
    /// The fields of `job` any rule reads.
    used: Vec<&'static str>,
}

/// The rules in force, swapped whole when SIGHUP reloads them.
pub type SharedRules = Arc<RwLock<Arc<SiteRules>>>;

/// The rules in force now.
pub fn current(rules: &SharedRules) -> Arc<SiteRules> {
    match rules.read() {
        Ok(r) => Arc::clone(&r),
        Err(poisoned) => Arc::clone(&poisoned.into_inner()),
    }
}

/// Ids of the built-in findings, which a site rule may not take.
const BUILT_IN: &[&str] = &[
    "cpu_efficiency",
    "serial_code",
    "idle_nodes",
    "thin_spread",
    "mig_fit",
    "cores_per_gpu",
    "memory_per_gpu",
    "memory_exhausted",
    "memory_underused",
    "gpu_unused",
    "gpu_low_use",
    "time_limit_overestimated",
    "job_failed",
    "energy",
];

impl SiteRules {
    /// The `finding-rules` array of the config. `file` (the config file) is read only to say
    /// on which line a refused rule is written.
    pub fn parse(value: toml::Value, file: Option<&Path>) -> Result<SiteRules, RuleError> {
        let text = file.and_then(|f| std::fs::read_to_string(f).ok());
        let configs: Vec<RuleConfig> =
            serde_path_to_error::deserialize(value).map_err(|e| RuleError {
                location: String::new(),
                key: crate::config::join_key("finding-rules", &e.path().to_string()),
                reason: e.into_inner().to_string(),
            })?;
        let mut seen = HashSet::new();
        let mut usage = Usage::default();
        let mut rules = Vec::with_capacity(configs.len());
        for (i, c) in configs.into_iter().enumerate() {
            let at = |field: &str, snippet: &str, nth: usize, reason: String| RuleError {
                location: locate(file, text.as_deref(), snippet, nth),
                key: format!("finding-rules[{i}].{field}"),
                reason,
            };
            let refuse = |field: &str, snippet: &str, reason: String| at(field, snippet, 0, reason);
            // An id is found quoted: `id = "gpu"`, not the first line holding `gpu`.
            let quoted = format!("\"{}\"", c.id);
            if c.id.trim().is_empty()
                || !c
                    .id
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
            {
                return Err(refuse(
                    "id",
                    &quoted,
                    format!("`{}`: an id is letters, digits and `_`", c.id),
                ));
            }
            if BUILT_IN.contains(&c.id.as_str()) {
                return Err(refuse(
                    "id",
                    &quoted,
                    format!("`{}` is a built-in finding", c.id),
                ));
            }
            if !seen.insert(c.id.clone()) {
                return Err(at(
                    "id",
                    &quoted,
                    1,
                    format!("a second rule with id `{}`", c.id),
                ));
            }
            let when = compile(&c.when, &mut usage).map_err(|e| refuse("when", &c.when, e))?;
            let message = Template::parse(&c.message, &mut usage)
                .map_err(|e| refuse("message", &c.message, e))?;
            let advice = Template::parse(&c.advice, &mut usage)
                .map_err(|e| refuse("advice", &c.advice, e))?;
            rules.push(SiteRule {
                id: c.id,
                severity: c.severity,
                when,
                message,
                advice,
            });
        }
        let used = match usage.whole {
            true => JOB_FIELDS.to_vec(),
            false => usage.fields.into_iter().collect(),
        };
        Ok(SiteRules { rules, used })
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The findings of the rules that hold for `job`. A rule whose condition cannot be
    /// decided (a figure it reads is null) does not fire; a placeholder that cannot be
    /// computed reads `unknown`.
    pub fn evaluate(&self, job: &JobFacts) -> Vec<Finding> {
        self.judge(&job.manager).evaluate(job)
    }

    /// A judge of the jobs of one manager's cluster: CEL's environment and the functions are
    /// made once for all of them (making them per job was most of a rule's cost).
    pub fn judge(&self, manager: &str) -> Judge<'_> {
        Judge {
            rules: self,
            root: (!self.rules.is_empty()).then(|| context(manager)),
        }
    }
}

/// [`SiteRules`] ready to judge the jobs of one manager (not `Send`: made and used between
/// two awaits).
pub struct Judge<'a> {
    rules: &'a SiteRules,
    root: Option<Context<'static, 'static>>,
}

impl Judge<'_> {
    /// See [`SiteRules::evaluate`].
    pub fn evaluate(&self, job: &JobFacts) -> Vec<Finding> {
        let Some(root) = &self.root else {
            return Vec::new();
        };
        let mut ctx = root.new_inner_scope();
        ctx.add_variable_from_value("job", job_value(job, &self.rules.used));
        self.rules
            .rules
            .iter()
            .filter(|r| matches!(r.when.execute(&ctx), Ok(Value::Bool(true))))
            .map(|r| Finding {
                id: r.id.clone(),
                severity: r.severity,
                message: r.message.render(&ctx),
                advice: r.advice.render(&ctx),
            })
            .collect()
    }
}

/// A root context with the functions of [`OWN_FUNCTIONS`], worded for `manager`.
fn context(manager: &str) -> Context<'static, 'static> {
    let mut ctx = Context::default();
    let (m1, m2) = (manager.to_owned(), manager.to_owned());
    // The names are not CEL's, so adding them cannot conflict.
    let _ = ctx.add_function("human_bytes", |v: Value| {
        text(number(&v).map(crate::store::findings::bytes))
    });
    let _ = ctx.add_function("human_duration", |v: Value| {
        text(number(&v).map(|s| crate::store::findings::duration(s as i64)))
    });
    let _ = ctx.add_function("memory_request", move |v: Value| {
        text(number(&v).and_then(|b| crate::manager::memory_request(&m1, b)))
    });
    let _ = ctx.add_function("time_request", move |v: Value| {
        text(number(&v).and_then(|s| crate::manager::time_request(&m2, s.ceil() as i64)))
    });
    ctx
}

/// A string, or null (read `unknown`) where there is none.
fn text(s: Option<String>) -> Value {
    s.map(Value::from).unwrap_or(Value::Null)
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Int(i) => Some(*i as f64),
        Value::UInt(u) => Some(*u as f64),
        Value::Float(f) if f.is_finite() => Some(*f),
        _ => None,
    }
}

/// `1.5`, `2`, `0.33`: at most two decimals, none trailing.
fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.to_string(),
        Value::Int(i) => i.to_string(),
        Value::UInt(u) => u.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Float(f) if f.is_finite() => {
            let s = format!("{f:.2}");
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        }
        _ => "unknown".to_owned(),
    }
}

/// Compiles `source` and checks that it names only `job`, its fields and known functions.
fn compile(source: &str, usage: &mut Usage) -> Result<Program, String> {
    let program = Program::compile(source).map_err(|e| {
        e.errors
            .iter()
            .map(|e| format!("line {}, column {}: {}", e.pos.0, e.pos.1 + 1, e.msg))
            .collect::<Vec<_>>()
            .join("; ")
    })?;
    let mut bound = Vec::new();
    check(program.expression(), &mut bound, usage)?;
    Ok(program)
}

/// Walks the expression: every free name is `job`, every `job.x` a field of [`JOB_FIELDS`],
/// every call a known function. Names a macro binds (`[1,2].all(x, x > 0)`) are allowed
/// inside it.
fn check(e: &IdedExpr, bound: &mut Vec<String>, usage: &mut Usage) -> Result<(), String> {
    match &e.expr {
        Expr::Ident(name) if name == "job" => {
            // `job` itself, not one of its fields: every field is needed.
            usage.whole = true;
            Ok(())
        }
        Expr::Ident(name) if name.starts_with('@') || bound.contains(name) => Ok(()),
        Expr::Ident(name) => Err(format!(
            "unknown name `{name}` (a rule reads `job.<field>`)"
        )),
        Expr::Select(s) if matches!(&s.operand.expr, Expr::Ident(n) if n == "job") => {
            match JOB_FIELDS.iter().find(|f| **f == s.field) {
                Some(f) => {
                    usage.fields.insert(f);
                    Ok(())
                }
                None => Err(format!(
                    "a job has no field `{}` (fields: {})",
                    s.field,
                    JOB_FIELDS.join(", ")
                )),
            }
        }
        Expr::Select(s) => check(&s.operand, bound, usage),
        Expr::Call(c) => {
            let operator = c.func_name.starts_with('_') || c.func_name.starts_with('!');
            if !operator
                && !CEL_FUNCTIONS.contains(&c.func_name.as_str())
                && !OWN_FUNCTIONS.contains(&c.func_name.as_str())
            {
                return Err(format!("unknown function `{}`", c.func_name));
            }
            if let Some(t) = &c.target {
                check(t, bound, usage)?;
            }
            c.args.iter().try_for_each(|a| check(a, bound, usage))
        }
        Expr::Comprehension(c) => {
            check(&c.iter_range, bound, usage)?;
            check(&c.accu_init, bound, usage)?;
            let depth = bound.len();
            bound.push(c.iter_var.clone());
            bound.push(c.accu_var.clone());
            let inner = [&c.loop_cond, &c.loop_step, &c.result]
                .into_iter()
                .try_for_each(|x| check(x, bound, usage));
            bound.truncate(depth);
            inner
        }
        Expr::List(l) => l.elements.iter().try_for_each(|x| check(x, bound, usage)),
        Expr::Map(m) => m.entries.iter().try_for_each(|entry| match &entry.expr {
            EntryExpr::MapEntry(me) => {
                check(&me.key, bound, usage).and_then(|_| check(&me.value, bound, usage))
            }
            EntryExpr::StructField(f) => check(&f.value, bound, usage),
        }),
        Expr::Struct(_) => Err("message types are not known here".to_owned()),
        Expr::Literal(_) | Expr::Unspecified => Ok(()),
    }
}

impl Template {
    /// `text {expr} text`; `{{` and `}}` stand for braces.
    fn parse(source: &str, usage: &mut Usage) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut chars = source.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    text.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    text.push('}');
                }
                '{' => {
                    let mut expr = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => expr.push(c),
                            None => return Err(format!("`{{{expr}` is not closed with `}}`")),
                        }
                    }
                    let program =
                        compile(&expr, usage).map_err(|e| format!("in `{{{expr}}}`: {e}"))?;
                    if !text.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut text)));
                    }
                    pieces.push(Piece::Expr(program));
                }
                '}' => return Err("a `}` without its `{` (write `}}` for a brace)".to_owned()),
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(Template(pieces))
    }

    fn render(&self, ctx: &Context) -> String {
        self.0
            .iter()
            .map(|p| match p {
                Piece::Text(t) => t.clone(),
                Piece::Expr(e) => e
                    .execute(ctx)
                    .map(|v| show(&v))
                    .unwrap_or_else(|_| "unknown".to_owned()),
            })
            .collect()
    }
}

/// `config file F line N: ` for the `nth` (from 0) line of `file` holding the first line of
/// `snippet`, or empty when the file or the line cannot be found.
fn locate(file: Option<&Path>, text: Option<&str>, snippet: &str, nth: usize) -> String {
    let (Some(file), Some(text)) = (file, text) else {
        return String::new();
    };
    let Some(needle) = snippet.lines().map(str::trim).find(|l| !l.is_empty()) else {
        return String::new();
    };
    let mut found = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(needle))
        .map(|(n, _)| n);
    match found.nth(nth) {
        Some(n) => format!("config file {} line {}: ", file.display(), n + 1),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(toml_text: &str) -> Result<SiteRules, RuleError> {
        let table: toml::Table = toml_text.parse().unwrap();
        SiteRules::parse(table["finding-rules"].clone(), None)
    }

    fn gpu_job() -> JobFacts {
        JobFacts {
            manager: "slurm".into(),
            user: "alice".into(),
            partition: "gpu".into(),
            state: "COMPLETED".into(),
            ended: true,
            elapsed_seconds: 300,
            time_limit_seconds: Some(7200),
            alloc_cpus: 8,
            alloc_mem_bytes: 32 << 30,
            alloc_gpus: 2,
            aggregated_seconds: 300,
            cpu_seconds: 300.0,
            memory_peak_bytes: Some(2.0 * (1u64 << 30) as f64),
            mean_gpu_utilization: Some(0.5),
            gpu_utilization_max: Some(0.9),
            measured: measured::CPU,
            ..Default::default()
        }
    }

    const SHORT_GPU: &str = r#"
        [[finding-rules]]
        id = "short_gpu_job"
        severity = "info"
        when = "job.alloc_gpus > 0 && job.ended && job.elapsed_seconds < 600"
        message = "It held {job.alloc_gpus} GPU(s) for {human_duration(job.elapsed_seconds)}, {job.cpu_efficiency}% CPU efficiency."
        advice = "Test on the debug partition; ask for {memory_request(job.memory_peak_bytes * 1.25)} next time ({{braces}} kept)."
    "#;

    #[test]
    fn a_rule_fires_with_its_figures_in_its_message_and_the_manager_s_request_in_its_advice() {
        let r = rules(SHORT_GPU).unwrap();
        let found = r.evaluate(&gpu_job());
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].id, "short_gpu_job");
        assert_eq!(found[0].severity, Severity::Info);
        assert_eq!(
            found[0].message,
            "It held 2 GPU(s) for 5 min 0 s, 12.5% CPU efficiency."
        );
        assert_eq!(
            found[0].advice,
            "Test on the debug partition; ask for --mem=3G next time ({braces} kept)."
        );
        let long = JobFacts {
            elapsed_seconds: 3600,
            ..gpu_job()
        };
        assert!(r.evaluate(&long).is_empty());
    }

    #[test]
    fn a_figure_prometheus_never_gave_is_null_so_a_rule_on_it_does_not_fire() {
        let r = rules(
            r#"[[finding-rules]]
               id = "idle_cpu"
               when = "job.cpu_efficiency < 50.0"
               message = "{job.cpu_efficiency}% of {job.alloc_cpus} cores; peak {human_bytes(job.memory_peak_bytes)}""#,
        )
        .unwrap();
        assert_eq!(
            r.evaluate(&gpu_job())[0].message,
            "12.5% of 8 cores; peak 2.0 GiB"
        );
        let unmeasured = JobFacts {
            measured: 0,
            ..gpu_job()
        };
        assert!(r.evaluate(&unmeasured).is_empty());
    }

    #[test]
    fn a_rule_that_does_not_parse_or_names_what_a_job_lacks_is_refused_saying_where() {
        let cases = [
            (
                "job.alloc_gpus >",
                "finding-rules[0].when",
                "line 1, column",
            ),
            (
                "job.gpus > 0",
                "finding-rules[0].when",
                "a job has no field `gpus`",
            ),
            ("gpus > 0", "finding-rules[0].when", "unknown name `gpus`"),
            (
                "nope(job.alloc_gpus)",
                "finding-rules[0].when",
                "unknown function `nope`",
            ),
        ];
        for (when, key, reason) in cases {
            let text = format!("[[finding-rules]]\nid = \"r\"\nwhen = '{when}'\nmessage = \"m\"\n");
            let e = rules(&text).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(reason), "{when}: {e}");
        }
        let bad_message =
            "[[finding-rules]]\nid = \"r\"\nwhen = 'true'\nmessage = \"{job.nope}\"\n";
        let e = rules(bad_message).unwrap_err().to_string();
        assert!(
            e.contains("finding-rules[0].message") && e.contains("no field `nope`"),
            "{e}"
        );
        let unclosed = "[[finding-rules]]\nid = \"r\"\nwhen = 'true'\nmessage = \"{job.user\"\n";
        assert!(rules(unclosed)
            .unwrap_err()
            .to_string()
            .contains("not closed"));
        let built_in = "[[finding-rules]]\nid = \"gpu_unused\"\nwhen = 'true'\nmessage = \"m\"\n";
        assert!(rules(built_in)
            .unwrap_err()
            .to_string()
            .contains("built-in"));
        let twice = "[[finding-rules]]\nid = \"a\"\nwhen = 'true'\nmessage = \"m\"\n[[finding-rules]]\nid = \"a\"\nwhen = 'true'\nmessage = \"m\"\n";
        let e = rules(twice).unwrap_err().to_string();
        assert!(
            e.contains("finding-rules[1].id") && e.contains("second rule"),
            "{e}"
        );
        let unknown_key =
            "[[finding-rules]]\nid = \"a\"\nwhen = 'true'\nmessage = \"m\"\nseverty = \"info\"\n";
        assert!(rules(unknown_key)
            .unwrap_err()
            .to_string()
            .contains("finding-rules[0]"));
    }

    #[test]
    fn a_refused_rule_names_its_line_in_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ceems.toml");
        let text = "[stats-server]\n\n[[stats-server.finding-rules]]\nid = \"r\"\nwhen = \"job.alloc_gpus >>\"\nmessage = \"m\"\n";
        std::fs::write(&file, text).unwrap();
        let table: toml::Table = text.parse().unwrap();
        let value = table["stats-server"]["finding-rules"].clone();
        let e = SiteRules::parse(value, Some(&file))
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("{} line 5:", file.display())), "{e}");
    }

    #[test]
    fn macros_bind_their_own_names_and_lists_of_strings_work() {
        let r = rules(
            r#"[[finding-rules]]
               id = "watched"
               when = "['alice', 'bob'].exists(u, u == job.user) && job.partition.startsWith('gp')"
               message = "{job.user} on {job.partition}""#,
        )
        .unwrap();
        assert_eq!(r.evaluate(&gpu_job())[0].message, "alice on gpu");
        let other =
            rules("[[finding-rules]]\nid = \"x\"\nwhen = '[1].all(u, v > 0)'\nmessage = \"m\"\n");
        assert!(other.unwrap_err().to_string().contains("unknown name `v`"));
    }

    #[test]
    fn every_field_a_rule_may_name_has_a_value_and_only_the_read_ones_are_built() {
        let job = JobFacts {
            node_cpu_seconds: vec![("n1".into(), 1.0)],
            gpu_memory_peak_bytes: Some(1.0),
            host_energy_joules: 1.0,
            gpu_energy_joules: 1.0,
            emissions_grams: 1.0,
            memory_fail_count: Some(0.0),
            measured: 31,
            ..gpu_job()
        };
        for name in JOB_FIELDS {
            assert_ne!(field(&job, name), Value::Null, "{name}");
        }
        let r = rules(SHORT_GPU).unwrap();
        let mut used = r.used.clone();
        used.sort();
        assert_eq!(
            used,
            [
                "alloc_gpus",
                "cpu_efficiency",
                "elapsed_seconds",
                "ended",
                "memory_peak_bytes"
            ]
        );
        let whole =
            rules("[[finding-rules]]\nid = \"x\"\nwhen = 'size(job) > 0'\nmessage = \"m\"\n")
                .unwrap();
        assert_eq!(whole.used.len(), JOB_FIELDS.len());
        assert_eq!(whole.evaluate(&job).len(), 1);
    }
}
