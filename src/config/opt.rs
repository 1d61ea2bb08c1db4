//! One option of a subcommand: its flag, key, kind, default, and the old spellings it keeps.

use clap::{Arg, ArgAction};
use toml::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `--x` sets true; `--no-x` sets false.
    Flag,
    Str,
    Int,
    Float,
    /// A humantime duration such as `30s` or `15m`, kept as a string until deserialized.
    Duration,
    /// A list of strings: a repeatable flag, or an array in the file. Its default is written
    /// comma-separated.
    List,
    /// A table or an array of tables, set only in the file and checked by its owner's serde
    /// types (a stats-server's `clusters`, say). No flag.
    FileOnly,
}

/// One option of a subcommand.
#[derive(Debug, Clone)]
pub struct Opt {
    /// Long flag without dashes, e.g. `web.listen-address`.
    pub flag: String,
    /// Dotted key path in the subcommand's table; usually the flag itself.
    pub key: String,
    pub kind: Kind,
    pub help: String,
    pub default: Option<String>,
    pub env: Option<String>,
    /// Other spellings accepted on the command line (CEEMS's deprecated ones).
    pub aliases: Vec<String>,
    /// Flags this option had before CEEMS renamed it: each is still accepted, hidden, as a
    /// flag, an environment variable and a config-file key, and its use is reported in
    /// [`Layered::deprecated`].
    pub renamed_from: Vec<String>,
    /// Environment variables this option had before it followed `CEEMS_<SUBCOMMAND>_<FLAG>`:
    /// still read, and their use reported in [`Layered::deprecated`].
    pub old_envs: Vec<String>,
    pub possible: Vec<&'static str>,
    pub hidden: bool,
}

impl Opt {
    pub fn new(flag: &str, kind: Kind, help: &str) -> Opt {
        Opt {
            flag: flag.to_owned(),
            key: flag.to_owned(),
            kind,
            help: help.to_owned(),
            default: None,
            env: None,
            aliases: Vec::new(),
            renamed_from: Vec::new(),
            old_envs: Vec::new(),
            possible: Vec::new(),
            hidden: false,
        }
    }

    pub fn flag(flag: &str, help: &str) -> Opt {
        Opt::new(flag, Kind::Flag, help).default("false")
    }

    pub fn default(mut self, value: &str) -> Opt {
        self.default = Some(value.to_owned());
        self
    }

    pub fn key(mut self, key: &str) -> Opt {
        self.key = key.to_owned();
        self
    }

    /// An environment variable the option was read from before its name followed the pattern.
    pub fn env_renamed_from(mut self, var: &str) -> Opt {
        self.old_envs.push(var.to_owned());
        self
    }

    pub fn env(mut self, var: &str) -> Opt {
        self.env = Some(var.to_owned());
        self
    }

    pub fn alias(mut self, alias: &str) -> Opt {
        self.aliases.push(alias.to_owned());
        self
    }

    /// The option's flag before a rename (see [`Opt::renamed_from`]).
    pub fn renamed_from(mut self, old_flag: &str) -> Opt {
        self.renamed_from.push(old_flag.to_owned());
        self
    }

    /// The old spellings as options of their own: hidden, without a default, setting this key.
    pub(super) fn old_spellings(&self) -> Vec<Opt> {
        self.renamed_from
            .iter()
            .map(|old| Opt {
                flag: old.clone(),
                key: self.key.clone(),
                help: format!("Deprecated: use --{}", self.flag),
                default: None,
                env: None,
                aliases: Vec::new(),
                renamed_from: Vec::new(),
                old_envs: Vec::new(),
                hidden: true,
                ..self.clone()
            })
            .collect()
    }

    /// Where an old spelling's value sat in the config file: the key, renamed as the flag was.
    pub(super) fn old_key(&self, old_flag: &str) -> String {
        match self.key.strip_prefix(&self.flag) {
            Some(rest) => format!("{old_flag}{rest}"),
            None => old_flag.to_owned(),
        }
    }

    pub fn possible(mut self, values: &[&'static str]) -> Opt {
        self.possible = values.to_vec();
        self
    }

    pub fn hidden(mut self) -> Opt {
        self.hidden = true;
        self
    }

    pub(super) fn negation_id(&self) -> String {
        format!("no-{}", self.flag)
    }

    pub(super) fn to_args(&self) -> Vec<Arg> {
        if self.kind == Kind::FileOnly {
            return Vec::new();
        }
        let mut arg = Arg::new(self.flag.clone())
            .long(self.flag.clone())
            .help(self.help.clone())
            .hide(self.hidden);
        for alias in &self.aliases {
            arg = arg.alias(alias.clone());
        }
        if let Some(env) = &self.env {
            arg = arg.env(env.clone());
        }
        match self.kind {
            Kind::Flag => {
                let negation = Arg::new(self.negation_id())
                    .long(self.negation_id())
                    .action(ArgAction::SetTrue)
                    .help(format!("Inverse of --{}", self.flag))
                    .hide(!self.key.ends_with(".enabled") || self.hidden)
                    .overrides_with(self.flag.clone());
                // `--x`, or `--x=false` as kingpin-style scripts write it.
                arg = arg
                    .action(ArgAction::Set)
                    .num_args(0..=1)
                    .require_equals(true)
                    .default_missing_value("true")
                    .value_name("BOOL")
                    .value_parser(clap::builder::BoolishValueParser::new())
                    .overrides_with(self.negation_id());
                vec![arg, negation]
            }
            kind => {
                arg = arg
                    .action(if kind == Kind::List {
                        ArgAction::Append
                    } else {
                        ArgAction::Set
                    })
                    .value_name(match kind {
                        Kind::Int => "INT",
                        Kind::Float => "FLOAT",
                        Kind::Duration => "DURATION",
                        _ => "VALUE",
                    });
                arg = match kind {
                    Kind::Int => arg.value_parser(clap::value_parser!(i64)),
                    Kind::Float => arg.value_parser(clap::value_parser!(f64)),
                    _ if !self.possible.is_empty() => arg.value_parser(
                        clap::builder::PossibleValuesParser::new(self.possible.iter().copied()),
                    ),
                    _ => arg,
                };
                if let Some(d) = &self.default {
                    arg = if kind == Kind::List {
                        arg.default_values(d.split(',').map(str::to_owned).collect::<Vec<_>>())
                    } else {
                        arg.default_value(d.clone())
                    };
                }
                vec![arg]
            }
        }
    }

    pub(super) fn parse_value(&self, raw: &str) -> Result<Value, String> {
        match self.kind {
            Kind::Flag => match raw {
                "true" | "1" | "yes" | "on" => Ok(Value::Boolean(true)),
                "false" | "0" | "no" | "off" | "" => Ok(Value::Boolean(false)),
                _ => Err(format!("`{raw}` is not a boolean")),
            },
            Kind::Int => raw
                .parse::<i64>()
                .map(Value::Integer)
                .map_err(|e| format!("`{raw}` is not an integer: {e}")),
            Kind::Float => raw
                .parse::<f64>()
                .map(Value::Float)
                .map_err(|e| format!("`{raw}` is not a number: {e}")),
            Kind::Str | Kind::Duration => Ok(Value::String(raw.to_owned())),
            Kind::FileOnly => Err("has no default from text".to_owned()),
            Kind::List => Ok(Value::Array(
                raw.split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| Value::String(s.to_owned()))
                    .collect(),
            )),
        }
    }
}
