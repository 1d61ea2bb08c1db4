//! SQL text with its bound values.

/// A value bound to a `?` of a query.
#[derive(Debug, Clone)]
pub(super) enum Arg {
    Int(i64),
    Text(String),
}

impl From<i64> for Arg {
    fn from(v: i64) -> Arg {
        Arg::Int(v)
    }
}

impl From<&str> for Arg {
    fn from(v: &str) -> Arg {
        Arg::Text(v.to_owned())
    }
}

/// SQL text with `?` placeholders and the values bound to them, in order.
#[derive(Debug, Default)]
pub(super) struct Sql {
    pub(super) text: String,
    pub(super) args: Vec<Arg>,
}

/// The end time of a job that has not ended, in the index `units_by_user_end` (migration 0005):
/// the query must spell the same expression for SQLite to search that index by range.
pub(super) const OPEN_END: &str = "coalesce(ended_at, 9223372036854775807)";

impl Sql {
    pub(super) fn new(text: &str) -> Sql {
        Sql {
            text: text.to_owned(),
            args: Vec::new(),
        }
    }

    pub(super) fn push(&mut self, text: &str) -> &mut Sql {
        self.text.push_str(text);
        self
    }

    pub(super) fn bind(&mut self, value: impl Into<Arg>) -> &mut Sql {
        self.text.push('?');
        self.args.push(value.into());
        self
    }

    /// ` AND col IN (?, ?, …)` with the values bound, or nothing for no values.
    pub(super) fn push_in(&mut self, col: &str, values: &[String]) -> &mut Sql {
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

    /// ` AND` jobs whose life overlaps `from`..`to`: ended after `from`, or still running, and
    /// started before `to`; with `running`, also every job still running whenever it started.
    pub(super) fn push_overlap(&mut self, from: i64, to: i64, running: bool) -> &mut Sql {
        self.push(" AND ").push(OPEN_END).push(" >= ").bind(from);
        self.push(" AND (started_at <= ").bind(to);
        if running {
            self.push(" OR (ended_at IS NULL AND state = 'RUNNING')");
        }
        self.push(")")
    }
}
