//! The one config loader shared by every subcommand.
//!
//! Each option is declared once, as an [`Opt`]: its flag, its key in the TOML file, its kind and
//! its default. From that list the loader builds the clap arguments and a TOML tree in which
//! later layers win: built-in defaults < the subcommand's table in `--config.file` < environment
//! < flags. The tree is then deserialized into the subcommand's typed config, where unknown keys
//! and bad values are errors that name the key and where it came from.
//!
//! Keys mirror flags: `--web.listen-address` is `listen-address` in `[exporter.web]`. CEEMS's
//! own YAML files are read into the same tree (`redfish_proxy_yaml`).

mod api_yaml;
pub mod http_client;
mod lb_yaml;
mod opt;
pub mod redfish_proxy_yaml;
pub mod runtime;
mod spelling;

pub use opt::{Kind, Opt};

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Command};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use toml::{Table, Value};

/// Environment variable naming the config file, like `--config.file`.
pub const CONFIG_FILE_ENV: &str = "CEEMS_CONFIG_FILE";
const CONFIG_FILE_ARG: &str = "config.file";

/// The tables a config file may hold, one per subcommand.
pub const SUBCOMMAND_TABLES: &[&str] = &[
    "exporter",
    "stats-server",
    "redfish-proxy",
    "lb",
    "check-privileges",
    "mailprog",
];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("config file {path} is not a valid redfish_proxy YAML file: {message}")]
    ProxyYaml { path: PathBuf, message: String },
    #[error("config file {path} is not a valid ceems_lb YAML file: {message}")]
    LbYaml { path: PathBuf, message: String },
    #[error("config file {path} (CEEMS's API server YAML): {message}")]
    ApiYaml { path: PathBuf, message: String },
    #[error("config file {path}: unknown table `{table}` (expected one of: {expected})")]
    UnknownTable {
        path: PathBuf,
        table: String,
        expected: String,
    },
    #[error("{origin}: key `{key}`: {message}")]
    Invalid {
        origin: String,
        key: String,
        message: String,
    },
}

/// The environment variable of an option: `CEEMS_<SUBCOMMAND>_<FLAG>`, upper-cased, with `.`
/// and `-` as `_` (`--web.listen-address` of the exporter: `CEEMS_EXPORTER_WEB_LISTEN_ADDRESS`).
pub fn env_name(subcommand: &str, flag: &str) -> String {
    format!("CEEMS_{subcommand}_{flag}")
        .chars()
        .map(|c| match c {
            '.' | '-' => '_',
            c => c.to_ascii_uppercase(),
        })
        .collect()
}

/// Adds the `--config.file` flag and every option's arguments to `cmd`; each option can also
/// be set by its environment variable (see [`env_name`]).
pub fn build_command(cmd: Command, opts: &[Opt]) -> Command {
    let sub = cmd.get_name().to_owned();
    let mut cmd = cmd.arg(
        Arg::new(CONFIG_FILE_ARG)
            .long(CONFIG_FILE_ARG)
            .env(CONFIG_FILE_ENV)
            .value_name("FILE")
            .help(
                "TOML config file; its table for this subcommand sets defaults that flags override",
            ),
    );
    // A list's flag in either number (`--lb.backends` for `--lb.backend`).
    let mut opts = opts.to_vec();
    spelling::add_number_aliases(&mut opts);
    for opt in opts
        .iter()
        .flat_map(|o| o.old_spellings().into_iter().chain([o.clone()]))
    {
        let mut opt = opt;
        if opt.env.is_none() {
            opt.env = Some(env_name(&sub, &opt.flag));
        }
        // `-h` is a summary: what a first run needs; `--help` has them all.
        let headline = SUMMARY_FLAGS.contains(&opt.flag.as_str())
            || (opt.key.ends_with(".enabled") && !opt.hidden);
        for arg in opt.to_args() {
            cmd = cmd.arg(arg.hide_short_help(!headline));
        }
    }
    let shown = opts.iter().filter(|o| !o.hidden).count();
    let long = cmd.get_after_help().map(|s| s.to_string());
    let cmd = cmd.after_help(format!(
        "-h shows the main options; --help all {shown}, with their environment variables and defaults (also in docs/reference/configuration.md)."
    ));
    match long {
        Some(text) => cmd.after_long_help(text),
        None => cmd,
    }
}

/// The options `-h` shows (with each collector's switch): where a program listens, logs and
/// finds what it needs first.
const SUMMARY_FLAGS: &[&str] = &[
    "web.listen-address",
    "web.config.file",
    "log.level",
    "collector.disable-defaults",
    "prometheus.url",
    "storage.data.path",
    "storage.database-url",
    "storage.update-interval",
    "slurm.cluster-id",
    "web.admin-users",
    "lb.backend",
    "lb.ceems-api-url",
    "redfish.target",
    "redfish.bmc-network",
    "stats-server.url",
    "smtp.host",
];

/// The merged settings of one subcommand, with a record of which keys flags or env set.
#[derive(Debug, Clone)]
pub struct Layered {
    pub table: Table,
    pub file: Option<PathBuf>,
    from_file: BTreeSet<String>,
    from_cli: BTreeSet<String>,
    /// One line per renamed spelling this run used (a flag, variable or file key), for the
    /// subcommand to log once logging is set up.
    pub deprecated: Vec<String>,
    /// The dotted path of this table in the subcommand's (empty at the top), so that an error
    /// names the whole key (`collector.timeout`, not `timeout`).
    scope: String,
}

impl Layered {
    /// Deserializes the whole tree, or a sub-table of it named by a dotted `path`.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ConfigError> {
        let value = if path.is_empty() {
            Value::Table(self.table.clone())
        } else {
            lookup(&self.table, path)
                .cloned()
                .unwrap_or_else(|| Value::Table(Table::new()))
        };
        serde_path_to_error::deserialize::<_, T>(value).map_err(|err| {
            let inner = err.path().to_string();
            let key = join_key(path, if inner == "." { "" } else { &inner });
            ConfigError::Invalid {
                origin: self.origin_of(&key),
                key: join_key(&self.scope, &key),
                // The key is named already: toml's own "in `key`" line would name it again,
                // shorter.
                message: strip_key_line(&err.into_inner().to_string()),
            }
        })
    }

    /// Takes a sub-table out of the tree, so that what is left can be checked for unknown keys.
    pub fn take(&mut self, path: &str) -> Table {
        take_path(&mut self.table, path).unwrap_or_default()
    }

    /// A copy of this config holding only the sub-table at `path`, for a part of the program
    /// that deserializes its own settings.
    pub fn scoped(&self, path: &str, table: Table) -> Layered {
        let prefix = format!("{path}.");
        let strip = |set: &BTreeSet<String>| {
            set.iter()
                .filter_map(|k| k.strip_prefix(&prefix).map(str::to_owned))
                .collect()
        };
        Layered {
            table,
            file: self.file.clone(),
            from_file: strip(&self.from_file),
            from_cli: strip(&self.from_cli),
            deprecated: Vec::new(),
            scope: join_key(&self.scope, path),
        }
    }

    /// Warns, once each, of the renamed spellings this run used.
    pub fn log_deprecated(&self) {
        for line in &self.deprecated {
            tracing::warn!("{line}");
        }
    }

    /// Whether `key` was set by the file, the environment or a flag rather than a default.
    pub fn explicit(&self, key: &str) -> bool {
        self.from_cli.contains(key) || self.from_file.contains(key)
    }

    /// Says where the value of `key` came from, for error messages.
    pub fn origin_of(&self, key: &str) -> String {
        let matches = |set: &BTreeSet<String>| {
            set.iter()
                .any(|k| k == key || key.starts_with(&format!("{k}.")) || k.starts_with(key))
        };
        if matches(&self.from_cli) {
            "command line or environment".to_owned()
        } else if let (Some(file), true) = (&self.file, matches(&self.from_file)) {
            format!("config file {}", file.display())
        } else if let Some(file) = &self.file {
            format!("config file {}", file.display())
        } else {
            "configuration".to_owned()
        }
    }
}

/// `message` without a last line `in `…``.
fn strip_key_line(message: &str) -> String {
    let trimmed = message.trim_end();
    match trimmed.rsplit_once('\n') {
        Some((head, last)) if last.starts_with("in `") && last.ends_with('`') => {
            head.trim_end().to_owned()
        }
        _ => trimmed.to_owned(),
    }
}

/// `prefix` and the key under it: `policies` and `[0].name` make `policies[0].name`.
pub fn join_key(prefix: &str, rest: &str) -> String {
    match (prefix.is_empty(), rest.is_empty()) {
        (true, _) => rest.to_owned(),
        (false, true) => prefix.to_owned(),
        (false, false) if rest.starts_with('[') => format!("{prefix}{rest}"),
        (false, false) => format!("{prefix}.{rest}"),
    }
}

fn lookup<'a>(table: &'a Table, path: &str) -> Option<&'a Value> {
    if path.is_empty() {
        return None;
    }
    let mut parts = path.split('.');
    let first = parts.next()?;
    let mut cur = table.get(first)?;
    for part in parts {
        cur = cur.as_table()?.get(part)?;
    }
    Some(cur)
}

fn take_path(table: &mut Table, path: &str) -> Option<Table> {
    let (head, rest) = match path.split_once('.') {
        Some((h, r)) => (h, Some(r)),
        None => (path, None),
    };
    match rest {
        None => match table.remove(head)? {
            Value::Table(t) => Some(t),
            other => {
                // Not a table: put it back so the caller's unknown-key check reports it.
                table.insert(head.to_owned(), other);
                None
            }
        },
        Some(rest) => take_path(table.get_mut(head)?.as_table_mut()?, rest),
    }
}

/// Removes the value at `path`, and the tables it leaves empty on the way.
fn remove_path(table: &mut Table, path: &str) -> Option<Value> {
    match path.split_once('.') {
        None => table.remove(path),
        Some((head, rest)) => {
            let inner = table.get_mut(head)?.as_table_mut()?;
            let v = remove_path(inner, rest)?;
            if inner.is_empty() {
                table.remove(head);
            }
            Some(v)
        }
    }
}

fn set_path(table: &mut Table, path: &str, value: Value) {
    let mut cur = table;
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().unwrap_or_default();
    for part in parts {
        let entry = cur
            .entry(part.to_owned())
            .or_insert_with(|| Value::Table(Table::new()));
        if !entry.is_table() {
            *entry = Value::Table(Table::new());
        }
        cur = match entry.as_table_mut() {
            Some(t) => t,
            None => return,
        };
    }
    cur.insert(last.to_owned(), value);
}

/// Deep-merges `over` into `base`, recording the dotted keys it set.
fn overlay(base: &mut Table, over: Table, prefix: &str, touched: &mut BTreeSet<String>) {
    for (k, v) in over {
        let key = join_key(prefix, &k);
        match (base.get_mut(&k), v) {
            (Some(Value::Table(b)), Value::Table(o)) => overlay(b, o, &key, touched),
            (_, v) => {
                touched.insert(key);
                base.insert(k, v);
            }
        }
    }
}

/// Reads the `[subcommand]` table of a config file; other subcommands' tables are left alone.
pub fn read_file(path: &Path, subcommand: &str) -> Result<Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let yaml = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yml" | "yaml")
    );
    if yaml && subcommand == "lb" {
        // CEEMS's ceems_lb file, possibly shared with its API server.
        let dir = path.parent().unwrap_or(Path::new("."));
        return lb_yaml::to_table(&text, dir).map_err(|message| ConfigError::LbYaml {
            path: path.to_owned(),
            message,
        });
    }
    if yaml && subcommand == "stats-server" {
        // CEEMS's ceems_api_server file.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        return api_yaml::to_table(&text, now).map_err(|message| ConfigError::ApiYaml {
            path: path.to_owned(),
            message,
        });
    }
    if yaml && subcommand == "redfish-proxy" {
        // CEEMS's redfish_proxy file, as its documentation deploys it.
        return redfish_proxy_yaml::to_table(&text).map_err(|message| ConfigError::ProxyYaml {
            path: path.to_owned(),
            message,
        });
    }
    let mut doc: Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::Syntax {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
    if let Some(unknown) = doc
        .keys()
        .find(|k| !SUBCOMMAND_TABLES.contains(&k.as_str()))
    {
        return Err(ConfigError::UnknownTable {
            path: path.to_owned(),
            table: unknown.clone(),
            expected: SUBCOMMAND_TABLES.join(", "),
        });
    }
    match doc.remove(subcommand) {
        None => Ok(Table::new()),
        Some(Value::Table(t)) => Ok(t),
        Some(_) => Err(ConfigError::Invalid {
            origin: format!("config file {}", path.display()),
            key: subcommand.to_owned(),
            message: "must be a table".to_owned(),
        }),
    }
}

/// Checks every key of a file's table against the declared options: unknown keys and values of
/// the wrong type are errors naming the full key, whether or not the part that owns the key
/// (a disabled collector, say) is in use.
fn validate(table: &Table, prefix: &str, opts: &[Opt], file: &Path) -> Result<(), ConfigError> {
    for (k, v) in table {
        let key = join_key(prefix, k);
        let invalid = |message: String| ConfigError::Invalid {
            origin: format!("config file {}", file.display()),
            key: key.clone(),
            message,
        };
        if let Some(opt) = opts.iter().find(|o| o.key == key) {
            let ok = match (opt.kind, v) {
                (Kind::Flag, Value::Boolean(_)) => true,
                (Kind::Int, Value::Integer(_)) => true,
                (Kind::Float, Value::Float(_) | Value::Integer(_)) => true,
                (Kind::Str, Value::String(s)) => {
                    if !opt.possible.is_empty() && !opt.possible.contains(&s.as_str()) {
                        return Err(invalid(format!(
                            "`{s}` is not one of: {}",
                            opt.possible.join(", ")
                        )));
                    }
                    true
                }
                (Kind::FileOnly, Value::Table(_) | Value::Array(_)) => true,
                (Kind::Duration, Value::String(s)) => {
                    humantime::parse_duration(s)
                        .map_err(|e| invalid(format!("`{s}` is not a duration: {e}")))?;
                    true
                }
                (Kind::List, Value::Array(items)) => {
                    for item in items {
                        let Value::String(s) = item else {
                            return Err(invalid(format!(
                                "expected a list of strings, found a {}",
                                item.type_str()
                            )));
                        };
                        if !opt.possible.is_empty() && !opt.possible.contains(&s.as_str()) {
                            return Err(invalid(format!(
                                "`{s}` is not one of: {}",
                                opt.possible.join(", ")
                            )));
                        }
                    }
                    true
                }
                _ => false,
            };
            if !ok {
                let want = match opt.kind {
                    Kind::Flag => "true or false",
                    Kind::Int => "an integer",
                    Kind::Float => "a number",
                    Kind::Str => "a string",
                    Kind::Duration => "a duration string such as \"30s\"",
                    Kind::List => "a list of strings",
                    Kind::FileOnly => "a table or an array of tables",
                };
                return Err(invalid(format!("expected {want}, got {}", v.type_str())));
            }
        } else if let (Value::Table(t), true) = (
            v,
            opts.iter().any(|o| o.key.starts_with(&format!("{key}."))),
        ) {
            validate(t, &key, opts, file)?;
        } else {
            return Err(invalid(match spelling::nearest_key(&key, opts) {
                Some(near) => format!("unknown key; did you mean `{near}`?"),
                None => "unknown key".to_owned(),
            }));
        }
    }
    Ok(())
}

/// Builds the layered settings of `subcommand` from its options and parsed arguments.
pub fn load(subcommand: &str, opts: &[Opt], matches: &ArgMatches) -> Result<Layered, ConfigError> {
    let mut table = Table::new();
    for opt in opts {
        if let Some(d) = &opt.default {
            let value = opt.parse_value(d).map_err(|message| ConfigError::Invalid {
                origin: "built-in default".to_owned(),
                key: opt.key.clone(),
                message,
            })?;
            set_path(&mut table, &opt.key, value);
        }
    }

    let file = matches
        .get_one::<String>(CONFIG_FILE_ARG)
        .map(PathBuf::from);
    let mut from_file = BTreeSet::new();
    let mut deprecated = Vec::new();
    if let Some(path) = &file {
        let mut file_table = read_file(path, subcommand)?;
        if let Some(Value::Array(notes)) = file_table.remove(redfish_proxy_yaml::DEPRECATED_KEY) {
            deprecated.extend(
                notes
                    .iter()
                    .filter_map(Value::as_str)
                    .map(|note| format!("config file {}: {note}", path.display())),
            );
        }
        for opt in opts {
            for old in &opt.renamed_from {
                let old_key = opt.old_key(old);
                if let Some(v) = remove_path(&mut file_table, &old_key) {
                    deprecated.push(format!(
                        "config file {}: `{old_key}` is deprecated, use `{}`",
                        path.display(),
                        opt.key
                    ));
                    if lookup(&file_table, &opt.key).is_none() {
                        set_path(&mut file_table, &opt.key, v);
                    }
                }
            }
        }
        // One value where a list is taken (`listen-address = ":9030"`) is a list of one.
        for opt in opts.iter().filter(|o| o.kind == Kind::List) {
            if let Some(Value::String(one)) = lookup(&file_table, &opt.key).cloned() {
                set_path(
                    &mut file_table,
                    &opt.key,
                    Value::Array(vec![Value::String(one)]),
                );
            }
        }
        spelling::accept_other_numbers(&mut file_table, opts);
        validate(&file_table, "", opts, path)?;
        overlay(&mut table, file_table, "", &mut from_file);
    }

    let mut from_cli = BTreeSet::new();
    // An old spelling first, so that the new one wins when both are given.
    let spellings = opts.iter().flat_map(|o| {
        o.old_spellings()
            .into_iter()
            .map(move |old| (old, Some(o)))
            .chain([(o.clone(), None)])
    });
    for (opt, renamed_to) in spellings {
        let explicit = |id: &str| {
            matches!(
                matches.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        };
        let value = match opt.kind {
            Kind::Flag => {
                let neg = opt.negation_id();
                // With overrides_with, only the last of --x / --no-x stays set.
                if explicit(&neg) && matches.get_flag(&neg) {
                    Some(Value::Boolean(false))
                } else if explicit(&opt.flag) {
                    Some(Value::Boolean(
                        matches.get_one::<bool>(&opt.flag).copied().unwrap_or(true),
                    ))
                } else {
                    None
                }
            }
            Kind::Int if explicit(&opt.flag) => matches
                .get_one::<i64>(&opt.flag)
                .map(|v| Value::Integer(*v)),
            Kind::Float if explicit(&opt.flag) => {
                matches.get_one::<f64>(&opt.flag).map(|v| Value::Float(*v))
            }
            Kind::Str | Kind::Duration if explicit(&opt.flag) => matches
                .get_one::<String>(&opt.flag)
                .map(|v| Value::String(v.clone())),
            Kind::List if explicit(&opt.flag) => matches
                .get_many::<String>(&opt.flag)
                .map(|vs| Value::Array(vs.map(|v| Value::String(v.clone())).collect())),
            _ => None,
        };
        if let Some(v) = value {
            if let Some(new) = renamed_to {
                deprecated.push(format!(
                    "--{} (or {}) is deprecated, use --{}",
                    opt.flag,
                    env_name(subcommand, &opt.flag),
                    new.flag
                ));
            }
            set_path(&mut table, &opt.key, v);
            from_cli.insert(opt.key.clone());
        }
    }

    // A value from an option's old environment variable, unless a flag or the new one gave one.
    for opt in opts {
        if from_cli.contains(&opt.key) {
            continue;
        }
        let Some((old, raw)) = opt
            .old_envs
            .iter()
            .find_map(|old| Some((old, std::env::var(old).ok()?)))
        else {
            continue;
        };
        let value = opt
            .parse_value(&raw)
            .map_err(|message| ConfigError::Invalid {
                origin: format!("environment variable {old}"),
                key: opt.key.clone(),
                message,
            })?;
        let new = opt
            .env
            .clone()
            .unwrap_or_else(|| env_name(subcommand, &opt.flag));
        deprecated.push(format!("{old} is deprecated, use {new}"));
        set_path(&mut table, &opt.key, value);
        from_cli.insert(opt.key.clone());
    }

    Ok(Layered {
        table,
        file,
        from_file,
        from_cli,
        deprecated,
        scope: String::new(),
    })
}

/// Deserializes a humantime duration (`30s`, `1m30s`, `1y`).
pub fn de_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let raw = String::deserialize(d)?;
    humantime::parse_duration(&raw)
        .map_err(|e| serde::de::Error::custom(format!("`{raw}` is not a duration: {e}")))
}

/// Deserializes a size in bytes: a number, or one with a unit (`512KiB`, `32MiB`, `1GiB`; `K`,
/// `M`, `G` are the same, `KB`, `MB`, `GB` powers of ten).
pub fn de_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Number(u64),
        Text(String),
    }
    match Raw::deserialize(d)? {
        Raw::Number(n) => Ok(n),
        Raw::Text(text) => parse_bytes(&text).map_err(serde::de::Error::custom),
    }
}

/// A size such as `32MiB` in bytes (see [`de_bytes`]).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "`{text}` is not a size: unit `{other}` (expected B, KiB, MiB, GiB, KB, MB or GB)"
            ))
        }
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("`{text}` is not a size in bytes such as 32MiB"))
}

/// Options shared by every subcommand: logging.
pub fn log_opts() -> Vec<Opt> {
    vec![
        Opt::new(
            "log.level",
            Kind::Str,
            "Only log messages with the given severity or above",
        )
        .default("info")
        .possible(&["debug", "info", "warn", "error"]),
        Opt::new("log.format", Kind::Str, "Output format of log messages")
            .default("logfmt")
            .possible(&["logfmt", "json"]),
    ]
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct LogConfig {
    pub level: String,
    pub format: String,
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_are_read_with_their_units_and_refused_without_sense() {
        assert_eq!(parse_bytes("32MiB"), Ok(32 << 20));
        assert_eq!(parse_bytes("512 KiB"), Ok(512 << 10));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("2MB"), Ok(2_000_000));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        for bad in [
            "",
            "MiB",
            "32 mebibytes",
            "-1MiB",
            "1.5GiB",
            "99999999999999999999GiB",
        ] {
            let err = parse_bytes(bad).unwrap_err();
            assert!(err.contains(&format!("`{bad}`")), "{bad}: {err}");
        }
    }

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "kebab-case")]
    struct Web {
        listen_address: String,
        max_requests: i64,
    }

    fn opts() -> Vec<Opt> {
        vec![
            Opt::new("web.listen-address", Kind::Str, "addr").default(":9010"),
            Opt::new("web.max-requests", Kind::Int, "max").default("40"),
            Opt::new("security.drop-privileges", Kind::Flag, "drop").default("true"),
            Opt::new("lb.addresses", Kind::List, "addresses").default(":9030,:9040"),
        ]
    }

    fn parse(args: &[&str], file: Option<&str>) -> Result<Layered, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let mut argv = vec!["exporter".to_owned()];
        if let Some(text) = file {
            let p = dir.path().join("ceems.toml");
            std::fs::write(&p, text).unwrap();
            argv.push(format!("--config.file={}", p.display()));
        }
        argv.extend(args.iter().map(|s| s.to_string()));
        let cmd = build_command(Command::new("exporter"), &opts());
        let m = cmd.try_get_matches_from(argv).unwrap();
        load("exporter", &opts(), &m)
    }

    #[test]
    fn an_error_in_a_scoped_table_names_the_whole_key_once() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Max {
            #[serde(rename = "max-requests", deserialize_with = "de_duration")]
            max_requests: Duration,
        }
        let l = parse(&["--web.max-requests=12"], None).unwrap();
        let web = l.scoped("web", l.get::<Table>("web").unwrap());
        let err = web.get::<Max>("").unwrap_err().to_string();
        assert!(err.contains("key `web.max-requests`"), "{err}");
        assert!(!err.contains("in `"), "the key is named twice: {err}");
    }

    #[test]
    fn flags_beat_file_and_file_beats_defaults() {
        let l = parse(&[], None).unwrap();
        let w: Web = l.get("web").unwrap();
        assert_eq!((w.listen_address.as_str(), w.max_requests), (":9010", 40));

        let file = "[exporter.web]\nlisten-address = \":1\"\nmax-requests = 3\n";
        let w: Web = parse(&[], Some(file)).unwrap().get("web").unwrap();
        assert_eq!((w.listen_address.as_str(), w.max_requests), (":1", 3));

        let w: Web = parse(&["--web.max-requests=7"], Some(file))
            .unwrap()
            .get("web")
            .unwrap();
        assert_eq!((w.listen_address.as_str(), w.max_requests), (":1", 7));
    }

    /// A file written when the key took one value still loads once it takes a list.
    #[test]
    fn one_value_in_a_file_is_a_list_of_one() {
        let addresses = |file: Option<&str>, args: &[&str]| -> Vec<String> {
            parse(args, file).unwrap().get("lb.addresses").unwrap()
        };
        assert_eq!(addresses(None, &[]), [":9030", ":9040"]);
        let file = "[exporter.lb]\naddresses = \":1\"\n";
        assert_eq!(addresses(Some(file), &[]), [":1"]);
        assert_eq!(
            addresses(Some(file), &["--lb.addresses=:2", "--lb.addresses=:3"]),
            [":2", ":3"]
        );
        let bad = parse(&[], Some("[exporter.lb]\naddresses = 9030\n")).unwrap_err();
        assert!(bad.to_string().contains("lb.addresses"), "{bad}");
    }

    #[test]
    fn flags_take_no_value_an_explicit_boolean_or_a_negation() {
        let drop = |args: &[&str]| -> bool {
            parse(args, None)
                .unwrap()
                .get::<toml::Table>("security")
                .unwrap()["drop-privileges"]
                .as_bool()
                .unwrap()
        };
        assert!(drop(&[]));
        assert!(!drop(&["--security.drop-privileges=false"]));
        assert!(!drop(&["--no-security.drop-privileges"]));
        assert!(drop(&["--security.drop-privileges"]));
        assert!(drop(&[
            "--no-security.drop-privileges",
            "--security.drop-privileges=yes"
        ]));
        // A following word is an argument of its own, not the flag's value.
        let cmd = build_command(Command::new("exporter"), &opts());
        assert!(cmd
            .try_get_matches_from(["exporter", "--security.drop-privileges", "false"])
            .is_err());
    }

    #[test]
    fn env_names_follow_flags() {
        assert_eq!(
            env_name("exporter", "web.listen-address"),
            "CEEMS_EXPORTER_WEB_LISTEN_ADDRESS"
        );
        assert_eq!(
            env_name("stats-server", "log.level"),
            "CEEMS_STATS_SERVER_LOG_LEVEL"
        );
    }

    #[test]
    fn unknown_key_names_key_and_file() {
        let err = parse(&[], Some("[exporter.web]\nlisten-adress = \":1\"\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("listen-adress"), "{err}");
        assert!(err.contains("ceems.toml"), "{err}");
    }

    #[test]
    fn bad_value_names_key() {
        let err = parse(&[], Some("[exporter.web]\nmax-requests = \"many\"\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("web.max-requests"), "{err}");
        assert!(err.contains("ceems.toml"), "{err}");
    }

    #[test]
    fn unknown_table_is_an_error() {
        let err = parse(&[], Some("[exportr]\n")).unwrap_err().to_string();
        assert!(err.contains("exportr"), "{err}");
    }

    #[test]
    fn syntax_error_names_file() {
        let err = parse(&[], Some("[exporter\n")).unwrap_err().to_string();
        assert!(
            err.contains("ceems.toml") && err.contains("not valid TOML"),
            "{err}"
        );
    }
}
