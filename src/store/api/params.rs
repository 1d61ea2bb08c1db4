//! A request's query parameters and time window.

use super::*;

/// Query parameters, each possibly repeated.
#[derive(Debug, Default)]
pub struct Params(BTreeMap<String, Vec<String>>);

impl Params {
    pub fn parse(query: Option<&str>) -> Params {
        let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            m.entry(k.into_owned()).or_default().push(v.into_owned());
        }
        Params(m)
    }

    pub(super) fn all(&self, key: &str) -> &[String] {
        self.0.get(key).map(Vec::as_slice).unwrap_or(&[])
    }

    pub(super) fn one(&self, key: &str) -> Option<&str> {
        self.all(key).last().map(String::as_str)
    }

    pub(super) fn time(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.one(key) {
            None | Some("") => Ok(None),
            Some(v) => v
                .parse::<i64>()
                .ok()
                .filter(|t| *t >= 0)
                .map(Some)
                .ok_or_else(|| {
                    ApiError::bad(format!("`{key}`: `{v}` is not a unix time in seconds"))
                }),
        }
    }

    pub(super) fn flag(&self, key: &str) -> Result<bool, ApiError> {
        match self.one(key) {
            None => Ok(false),
            Some("" | "true" | "1") => Ok(true),
            Some("false" | "0") => Ok(false),
            Some(v) => Err(ApiError::bad(format!(
                "`{key}`: `{v}` is not true or false"
            ))),
        }
    }

    /// Rejects parameters the route does not know, so a typo is not silently ignored.
    pub(super) fn only(&self, known: &[&str]) -> Result<(), ApiError> {
        match self.0.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(ApiError::bad(format!(
                "unknown query parameter `{k}` (known: {})",
                known.join(", ")
            ))),
            None => Ok(()),
        }
    }
}

/// Time window of a request: `[from, to]`, by default the last day.
pub(super) fn window(p: &Params, now: i64) -> Result<(i64, i64), ApiError> {
    let to = p.time("to")?.unwrap_or(now);
    let from = p.time("from")?.unwrap_or(to - DEFAULT_WINDOW_SECONDS);
    if from > to {
        return Err(ApiError::bad(format!(
            "`from` ({from}) is after `to` ({to})"
        )));
    }
    Ok((from, to))
}
