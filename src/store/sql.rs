//! One way to write a query for both databases: SQL text with `$N` placeholders (SQLite and
//! PostgreSQL both read them), the values bound to them, and rows read by column index.
//! Queries stay native to each driver; only the few spellings that differ go through
//! [`Backend`].

use sqlx::postgres::{PgRow, Postgres};
use sqlx::sqlite::{Sqlite, SqliteRow};
use sqlx::Row as _;

/// Which database holds the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }

    /// A JSON object built from `'name', expr, …` pairs, as text.
    pub fn json_object(self, pairs: &str) -> String {
        match self {
            Backend::Sqlite => format!("json_object({pairs})"),
            Backend::Postgres => format!("json_build_object({pairs})::text"),
        }
    }

    /// A column that holds JSON text, embedded in a JSON object as JSON (not as a string).
    pub fn json_column(self, expr: &str) -> String {
        match self {
            Backend::Sqlite => format!("json({expr})"),
            Backend::Postgres => format!("({expr})::json"),
        }
    }

    /// The integer `col` of a group's rows joined with commas, in `order`.
    pub fn join_ids(self, col: &str, order: &str) -> String {
        match self {
            Backend::Sqlite => format!("group_concat({col}, ',' ORDER BY {order})"),
            Backend::Postgres => format!("string_agg({col}::text, ',' ORDER BY {order})"),
        }
    }
}

/// A value bound to a placeholder.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    Int(Option<i64>),
    Real(Option<f64>),
    Text(Option<String>),
    Bool(bool),
    Bytes(Vec<u8>),
}

impl From<i64> for Arg {
    fn from(v: i64) -> Arg {
        Arg::Int(Some(v))
    }
}

impl From<Option<i64>> for Arg {
    fn from(v: Option<i64>) -> Arg {
        Arg::Int(v)
    }
}

impl From<Option<u32>> for Arg {
    fn from(v: Option<u32>) -> Arg {
        Arg::Int(v.map(i64::from))
    }
}

impl From<f64> for Arg {
    fn from(v: f64) -> Arg {
        Arg::Real(Some(v))
    }
}

impl From<Option<f64>> for Arg {
    fn from(v: Option<f64>) -> Arg {
        Arg::Real(v)
    }
}

impl From<&str> for Arg {
    fn from(v: &str) -> Arg {
        Arg::Text(Some(v.to_owned()))
    }
}

impl From<&String> for Arg {
    fn from(v: &String) -> Arg {
        Arg::Text(Some(v.clone()))
    }
}

impl From<String> for Arg {
    fn from(v: String) -> Arg {
        Arg::Text(Some(v))
    }
}

impl From<Option<&str>> for Arg {
    fn from(v: Option<&str>) -> Arg {
        Arg::Text(v.map(str::to_owned))
    }
}

impl From<Option<String>> for Arg {
    fn from(v: Option<String>) -> Arg {
        Arg::Text(v)
    }
}

impl From<bool> for Arg {
    fn from(v: bool) -> Arg {
        Arg::Bool(v)
    }
}

impl From<Vec<u8>> for Arg {
    fn from(v: Vec<u8>) -> Arg {
        Arg::Bytes(v)
    }
}

/// SQL text with `$N` placeholders and the values bound to them, in order.
#[derive(Debug, Default, Clone)]
pub struct Sql {
    text: String,
    /// The same text with `?` for each placeholder, kept while every placeholder comes from
    /// `bind` (and so in order): a batch's statement then needs no rewriting for SQLite.
    anonymous: Option<String>,
    pub args: Vec<Arg>,
}

/// Whether `text` holds a `$N` placeholder (or something that reads as one).
fn numbers_a_placeholder(text: &str) -> bool {
    text.as_bytes()
        .windows(2)
        .any(|w| w[0] == b'$' && w[1].is_ascii_digit())
}

impl Sql {
    /// A query whose text already numbers its placeholders; give their values with `arg`.
    pub fn new(text: &str) -> Sql {
        Sql {
            text: text.to_owned(),
            anonymous: (!numbers_a_placeholder(text)).then(|| text.to_owned()),
            args: Vec::new(),
        }
    }

    /// The text in PostgreSQL's spelling (`$N`).
    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn push(&mut self, text: &str) -> &mut Sql {
        self.text.push_str(text);
        if numbers_a_placeholder(text) {
            self.anonymous = None;
        } else if let Some(a) = &mut self.anonymous {
            a.push_str(text);
        }
        self
    }

    /// Writes the next placeholder and binds `value` to it.
    pub fn bind(&mut self, value: impl Into<Arg>) -> &mut Sql {
        use std::fmt::Write as _;
        self.args.push(value.into());
        // Writing to a String cannot fail.
        let _ = write!(self.text, "${}", self.args.len());
        if let Some(a) = &mut self.anonymous {
            a.push('?');
        }
        self
    }

    /// The value of the next placeholder already in the text.
    pub fn arg(mut self, value: impl Into<Arg>) -> Sql {
        self.args.push(value.into());
        self
    }

    /// The text in SQLite's spelling: `?` where the placeholders come in order, each once (as
    /// `bind` writes them), `?N` otherwise. For each value it binds, sqlx asks SQLite the
    /// parameter's name, which SQLite finds by a scan of the named ones: over the 12,000 of
    /// a batch insert that took 14 times the insert itself.
    pub fn sqlite_text(&self) -> std::borrow::Cow<'_, str> {
        if let Some(a) = &self.anonymous {
            return std::borrow::Cow::Borrowed(a);
        }
        let mut numbered = String::with_capacity(self.text.len());
        let mut anonymous = String::with_capacity(self.text.len());
        let (mut in_order, mut next, mut quoted) = (true, 1usize, false);
        let mut rest = self.text.as_str();
        while let Some(at) = rest.find('$') {
            let (before, after) = rest.split_at(at);
            quoted ^= before.matches('\'').count() % 2 == 1;
            numbered.push_str(before);
            anonymous.push_str(before);
            let tail = &after[1..];
            let digits = tail.len() - tail.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            if quoted || digits == 0 {
                numbered.push('$');
                anonymous.push('$');
                rest = tail;
                continue;
            }
            let (number, after_number) = tail.split_at(digits);
            in_order &= number.parse() == Ok(next);
            next += 1;
            numbered.push('?');
            numbered.push_str(number);
            anonymous.push('?');
            rest = after_number;
        }
        numbered.push_str(rest);
        anonymous.push_str(rest);
        std::borrow::Cow::Owned(if in_order { anonymous } else { numbered })
    }

    /// ` AND col IN ($n, …)` with the values bound, or nothing for no values.
    pub fn push_in(&mut self, col: &str, values: &[String]) -> &mut Sql {
        if let Some((first, rest)) = values.split_first() {
            self.push(" AND ")
                .push(col)
                .push(" IN (")
                .bind(first.as_str());
            for v in rest {
                self.push(", ").bind(v.as_str());
            }
            self.push(")");
        }
        self
    }

    /// ` AND` jobs that ended between `from` and `to`, and with `running` those running
    /// (CEEMS's window of `/units`). The same selection as `unit_cache::select`.
    pub fn push_ended_in(&mut self, from: i64, to: i64, running: bool) -> &mut Sql {
        self.push(" AND ").push(OPEN_END).push(" >= ").bind(from);
        self.push(" AND (").push(OPEN_END).push(" <= ").bind(to);
        if running {
            self.push(" OR (ended_at IS NULL AND state = 'RUNNING')");
        }
        self.push(")")
    }

    /// ` AND` jobs whose life overlaps `from`..`to`: ended after `from`, or still running, and
    /// started before `to`; with `running`, also every job still running whenever it started.
    pub fn push_overlap(&mut self, from: i64, to: i64, running: bool) -> &mut Sql {
        self.push(" AND ").push(OPEN_END).push(" >= ").bind(from);
        self.push(" AND (started_at <= ").bind(to);
        if running {
            self.push(" OR (ended_at IS NULL AND state = 'RUNNING')");
        }
        self.push(")")
    }
}

/// The end time of a job that has not ended, in the index `units_by_user_end` (migration 0005):
/// a query must spell the same expression for the database to search that index by range.
pub const OPEN_END: &str = "coalesce(ended_at, 9223372036854775807)";

/// Binds every value of `args` to `query`.
macro_rules! bind_args {
    ($query:expr, $args:expr) => {{
        let mut q = $query;
        for arg in $args {
            q = match arg {
                Arg::Int(v) => q.bind(*v),
                Arg::Real(v) => q.bind(*v),
                Arg::Text(v) => q.bind(v.as_deref()),
                Arg::Bool(v) => q.bind(*v),
                Arg::Bytes(v) => q.bind(v.as_slice()),
            };
        }
        q
    }};
}
pub(crate) use bind_args;

/// A value both drivers can read from a column.
pub trait Column:
    for<'r> sqlx::Decode<'r, Sqlite>
    + sqlx::Type<Sqlite>
    + for<'r> sqlx::Decode<'r, Postgres>
    + sqlx::Type<Postgres>
{
}

impl<T> Column for T where
    T: for<'r> sqlx::Decode<'r, Sqlite>
        + sqlx::Type<Sqlite>
        + for<'r> sqlx::Decode<'r, Postgres>
        + sqlx::Type<Postgres>
{
}

/// One row of a result, from either database.
pub enum DbRow {
    Sqlite(SqliteRow),
    Postgres(PgRow),
}

impl DbRow {
    /// The column `i`; a column of another type reads as an error.
    pub fn get<T: Column>(&self, i: usize) -> Result<T, sqlx::Error> {
        match self {
            DbRow::Sqlite(r) => r.try_get(i),
            DbRow::Postgres(r) => r.try_get(i),
        }
    }

    /// A boolean expression: SQLite answers it with 0 or 1, PostgreSQL with a boolean.
    pub fn flag(&self, i: usize) -> Result<bool, sqlx::Error> {
        match self {
            DbRow::Sqlite(r) => r.try_get::<i64, _>(i).map(|v| v != 0),
            DbRow::Postgres(r) => r.try_get(i),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_in_binding_order() {
        let mut q = Sql::new("SELECT 1 WHERE a = ");
        q.bind(1i64)
            .push(" AND b IN (")
            .bind("x")
            .push(", ")
            .bind(2.5)
            .push(")");
        assert_eq!(q.text(), "SELECT 1 WHERE a = $1 AND b IN ($2, $3)");
        assert_eq!(q.sqlite_text(), "SELECT 1 WHERE a = ? AND b IN (?, ?)");
        assert_eq!(
            q.args,
            [
                Arg::Int(Some(1)),
                Arg::Text(Some("x".into())),
                Arg::Real(Some(2.5))
            ]
        );
        let q = Sql::new("DELETE FROM t WHERE c = $1").arg(Some("y"));
        assert_eq!(q.args, [Arg::Text(Some("y".into()))]);
        let q = Sql::new("SELECT json_extract(f, '$.id'), '$1' FROM t WHERE a = $1 AND b = $2");
        assert_eq!(
            q.sqlite_text(),
            "SELECT json_extract(f, '$.id'), '$1' FROM t WHERE a = ? AND b = ?"
        );
        let mut q = Sql::new("SELECT a FROM t WHERE b = ");
        q.bind(1i64).push(" AND c = $1");
        assert_eq!(q.sqlite_text(), "SELECT a FROM t WHERE b = ?1 AND c = ?1");
        let q = Sql::new("UPDATE t SET a = $2, b = CASE WHEN $2 = 'x' THEN $1 END WHERE c = $10");
        assert_eq!(
            q.sqlite_text(),
            "UPDATE t SET a = ?2, b = CASE WHEN ?2 = 'x' THEN ?1 END WHERE c = ?10"
        );
    }
}
