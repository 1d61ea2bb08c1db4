//! Job ids wrap (Slurm's after 67M jobs): the same id names an old job of one user and a new
//! job of another. A user's request is therefore served only for the time the units it names
//! were theirs: from the first one's start to the last one's end (running: no end), each side
//! widened by a margin of one scrape interval. A range (Prometheus's `query_range`, series and
//! label calls, Pyroscope's calls) is clipped to that window; an instant query's time is moved
//! into it; what its expression reads (ranges, offsets, `@`) must not reach a time the id was
//! another user's, as far as the stats-server's database knows.

use crate::store::db::Tenure;

/// When the units a user asks for were theirs, in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub start: f64,
    /// None while one of the units runs.
    pub end: Option<f64>,
    /// When their ids were other users' units: start, and end (none while running).
    pub others: Vec<(f64, Option<f64>)>,
}

impl Window {
    /// The window of `tenures` (every unit holding one of the requested ids), `margin` seconds
    /// wide on each side; a pending unit of the user's counts from `now`. None when none is
    /// the user's.
    pub fn of(tenures: &[Tenure], margin: f64, now: f64) -> Option<Window> {
        let theirs: Vec<&Tenure> = tenures.iter().filter(|t| t.theirs).collect();
        let start = theirs
            .iter()
            .map(|t| t.start.map_or(now, |s| s as f64))
            .reduce(f64::min)?;
        let end = theirs
            .iter()
            .map(|t| t.end.map(|e| e as f64))
            .try_fold(f64::MIN, |latest, end| end.map(|e| latest.max(e)));
        let others = tenures
            .iter()
            .filter(|t| !t.theirs)
            .filter_map(|t| Some((t.start? as f64, t.end.map(|e| e as f64 + margin))))
            .collect();
        Some(Window {
            start: start - margin,
            end: end.map(|e| e + margin),
            others,
        })
    }

    /// `[from, to]` clipped to the window; None when nothing of it is left.
    pub fn clip(&self, from: f64, to: f64) -> Option<(f64, f64)> {
        let from = from.max(self.start);
        let to = match self.end {
            Some(end) => to.min(end),
            None => to,
        };
        (from <= to).then_some((from, to))
    }

    /// Whether reading `[from, to]` reads a time one of the ids was another user's.
    pub fn reaches_others(&self, from: f64, to: f64) -> bool {
        self.others
            .iter()
            .any(|(start, end)| *start <= to && end.is_none_or(|e| from <= e))
    }

    /// Whether `[from, to]` lies within the window.
    pub fn holds(&self, from: f64, to: f64) -> bool {
        from >= self.start && self.end.is_none_or(|e| to <= e)
    }
}

/// A Prometheus API time: Unix seconds (fractions allowed) or RFC 3339, as Prometheus
/// parses it.
pub fn parse_time(text: &str) -> Option<f64> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<f64>() {
        return seconds.is_finite().then_some(seconds);
    }
    let t: jiff::Timestamp = text.parse().ok()?;
    Some(t.as_millisecond() as f64 / 1000.0)
}

/// A time as the stores read it: seconds with milliseconds.
pub fn format_time(seconds: f64) -> String {
    format!("{seconds:.3}")
}

/// Why a request's times cannot be served.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum WindowError {
    #[error("`{0}` is given more than once")]
    Repeated(&'static str),
    #[error("`{0}` is not a time: {1}")]
    BadTime(&'static str, String),
    #[error("the time asked for is outside the job's, which is yours only from {start} to {end} (its id belongs to other jobs at other times)")]
    Outside { start: String, end: String },
    #[error("the query reads a time when its job id belonged to another user's job; ask for a time within your job's")]
    ReachesOthers,
}

impl Window {
    fn outside(&self) -> WindowError {
        let time = |t: f64| {
            jiff::Timestamp::from_millisecond((t * 1000.0) as i64)
                .map_or_else(|_| format_time(t), |t| t.to_string())
        };
        WindowError::Outside {
            start: time(self.start),
            end: self.end.map_or_else(|| "now".to_owned(), time),
        }
    }

    /// The evaluation range `[from, to]` (an instant query's `from == to`) fitted to the
    /// window: a range clipped, an instant moved into it; refused when what `reach` reads
    /// from there touches another user's time.
    pub fn fit(
        &self,
        from: f64,
        to: f64,
        reach: &super::query::Reach,
    ) -> Result<(f64, f64), WindowError> {
        let (from, to) = if from == to {
            let end = self.end.unwrap_or(f64::INFINITY);
            let t = from.clamp(self.start, end.max(self.start));
            (t, t)
        } else {
            self.clip(from, to).ok_or_else(|| self.outside())?
        };
        let reaches_others = self.reaches_others(from + reach.from, to + reach.to)
            || reach
                .anchored
                .iter()
                .any(|(lo, hi)| !self.holds(*hi, *hi) || self.reaches_others(*lo, *hi));
        match reaches_others {
            true => Err(WindowError::ReachesOthers),
            false => Ok((from, to)),
        }
    }
}

/// The one value of `key` among `params`, read as a time.
fn one_time(params: &[(String, String)], key: &'static str) -> Result<Option<f64>, WindowError> {
    let mut values = params.iter().filter(|(k, _)| k == key).map(|(_, v)| v);
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(WindowError::Repeated(key));
    }
    parse_time(value)
        .map(Some)
        .ok_or_else(|| WindowError::BadTime(key, value.chars().take(40).collect()))
}

/// The time parameters of a Prometheus API request fitted to `window`: those to send instead
/// of the request's (none when it fits as it is).
/// `reach` is how far from their evaluation time its queries read (series and label calls
/// read only their range).
pub fn fit_prometheus(
    window: &Window,
    path: &str,
    params: &[(String, String)],
    reach: &super::query::Reach,
    now: f64,
) -> Result<Vec<(&'static str, String)>, WindowError> {
    let no_reach = super::query::Reach::default();
    let (from_key, to_key, from, to, reach) = match path {
        "/api/v1/query" | "/api/v1/query_range" => {
            if path == "/api/v1/query" {
                let t = one_time(params, "time")?.unwrap_or(now);
                ("time", "time", t, t, reach)
            } else {
                match (one_time(params, "start")?, one_time(params, "end")?) {
                    (Some(from), Some(to)) if from < to => ("start", "end", from, to, reach),
                    // The store refuses what is missing or reversed.
                    _ => return Ok(Vec::new()),
                }
            }
        }
        // Series and label calls: no start is all the past, no end now.
        _ => {
            let from = one_time(params, "start")?.unwrap_or(f64::MIN);
            let to = one_time(params, "end")?.unwrap_or(now);
            if from > to {
                return Ok(Vec::new());
            }
            ("start", "end", from, to, &no_reach)
        }
    };
    let (mut fitted_from, fitted_to) = window.fit(from, to, reach)?;
    // A graph's points stay on the grid its panel asked for (`start + k × step`).
    let step = params
        .iter()
        .find(|(k, _)| k == "step")
        .and_then(|(_, v)| step_seconds(v));
    if let (true, Some(step)) = (path == "/api/v1/query_range" && fitted_from != from, step) {
        let aligned = from + ((fitted_from - from) / step).ceil() * step;
        if aligned <= fitted_to {
            fitted_from = aligned;
        }
    }
    let mut replace = Vec::new();
    if fitted_from != from {
        replace.push((from_key, format_time(fitted_from)));
    }
    if fitted_to != to && to_key != from_key {
        replace.push((to_key, format_time(fitted_to)));
    }
    Ok(replace)
}

/// A `step` as Prometheus reads it: seconds, or a duration such as `15s` or `1m30s`.
fn step_seconds(text: &str) -> Option<f64> {
    let seconds = match text.trim().parse::<f64>() {
        Ok(s) => s,
        Err(_) => humantime::parse_duration(text.trim()).ok()?.as_secs_f64(),
    };
    (seconds.is_finite() && seconds > 0.0).then_some(seconds)
}

/// The URL query and form body of a request with `replace`'s parameters in place of theirs
/// (in the URL, which Prometheus reads as well as the body).
pub fn rewrite(
    url_query: Option<&str>,
    body: &[u8],
    replace: &[(&'static str, String)],
) -> (String, Vec<u8>) {
    let kept = |raw: &[u8], out: &mut form_urlencoded::Serializer<String>| {
        for (k, v) in form_urlencoded::parse(raw) {
            if !replace.iter().any(|(r, _)| *r == k) {
                out.append_pair(&k, &v);
            }
        }
    };
    let mut query = form_urlencoded::Serializer::new(String::new());
    kept(url_query.unwrap_or("").as_bytes(), &mut query);
    for (k, v) in replace {
        query.append_pair(k, v);
    }
    let body = match body.is_empty() {
        true => Vec::new(),
        false => {
            let mut form = form_urlencoded::Serializer::new(String::new());
            kept(body, &mut form);
            form.finish().into_bytes()
        }
    };
    (query.finish(), body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenure(start: Option<i64>, end: Option<i64>, theirs: bool) -> Tenure {
        Tenure {
            uuid: "7".into(),
            start,
            end,
            theirs,
        }
    }

    #[test]
    fn alices_old_job_and_bobs_new_one() {
        let tenures = [
            tenure(Some(1000), Some(2000), true),
            tenure(Some(5000), None, false),
        ];
        let alice = Window::of(&tenures, 60.0, 9000.0).unwrap();
        assert_eq!((alice.start, alice.end), (940.0, Some(2060.0)));
        // A dashboard's week is clipped to her job; a time in bob's is moved back to hers.
        assert_eq!(alice.clip(0.0, 9000.0), Some((940.0, 2060.0)));
        assert_eq!(alice.clip(6000.0, 6000.0), None);
        assert!(alice.reaches_others(4000.0, 5000.0));
        assert!(!alice.reaches_others(1000.0, 4999.0));
        assert!(alice.holds(1000.0, 2000.0) && !alice.holds(1000.0, 3000.0));
        // Bob's window has no end, and alice's job is another's to him.
        let bob_tenures: Vec<Tenure> = tenures
            .iter()
            .map(|t| Tenure {
                theirs: !t.theirs,
                ..t.clone()
            })
            .collect();
        let bob = Window::of(&bob_tenures, 60.0, 9000.0).unwrap();
        assert_eq!((bob.start, bob.end), (4940.0, None));
        assert_eq!(bob.others, [(1000.0, Some(2060.0))]);
        assert!(bob.reaches_others(2000.0, 9000.0));
        // Nobody's.
        assert!(Window::of(&[tenure(Some(1), Some(2), false)], 60.0, 9.0).is_none());
        // A pending job of the user's counts from now.
        let pending = Window::of(&[tenure(None, None, true)], 60.0, 9000.0).unwrap();
        assert_eq!((pending.start, pending.end), (8940.0, None));
    }

    fn pairs(q: &str) -> Vec<(String, String)> {
        form_urlencoded::parse(q.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    }

    #[test]
    fn requests_are_fitted_to_the_users_time() {
        let alice = Window {
            start: 940.0,
            end: Some(2060.0),
            others: vec![(5000.0, None)],
        };
        let fit = |path: &str, q: &str| {
            let params = pairs(q);
            let mut scope = crate::lb::query::Scope::default();
            for (_, query) in params.iter().filter(|(k, _)| k == "query") {
                scope.extend(crate::lb::query::scope_of_query(query).unwrap());
            }
            fit_prometheus(&alice, path, &params, &scope.reach, 9000.0)
        };
        let q = "query=x%7Buuid%3D%227%22%7D";
        // Inside: as asked.
        assert_eq!(fit("/api/v1/query", &format!("{q}&time=1500")), Ok(vec![]));
        // After her job: moved to its end, when her series were last written.
        assert_eq!(
            fit("/api/v1/query", q),
            Ok(vec![("time", "2060.000".to_owned())])
        );
        // A week's graph: her job's part of it, on the panel's grid (0 + k × 60 s).
        assert_eq!(
            fit(
                "/api/v1/query_range",
                &format!("{q}&start=0&end=9000&step=60")
            ),
            Ok(vec![
                ("start", "960.000".to_owned()),
                ("end", "2060.000".to_owned())
            ])
        );
        assert_eq!(
            fit(
                "/api/v1/query_range",
                &format!("{q}&start=10&end=9000&step=1m")
            ),
            Ok(vec![
                ("start", "970.000".to_owned()),
                ("end", "2060.000".to_owned())
            ])
        );
        assert!(matches!(
            fit(
                "/api/v1/query_range",
                &format!("{q}&start=5000&end=9000&step=60")
            ),
            Err(WindowError::Outside { .. })
        ));
        // Reading back from her job's end into bob's is fine; forward into it is not.
        let ahead = "query=x%7Buuid%3D%227%22%7D%20offset%20-2h&time=2000";
        assert_eq!(fit("/api/v1/query", ahead), Err(WindowError::ReachesOthers));
        let at = "query=x%7Buuid%3D%227%22%7D%20%40%206000&time=2000";
        assert_eq!(fit("/api/v1/query", at), Err(WindowError::ReachesOthers));
        assert_eq!(
            fit("/api/v1/series", "match[]=x&end=3000"),
            Ok(vec![
                ("start", "940.000".to_owned()),
                ("end", "2060.000".to_owned())
            ])
        );
        assert_eq!(
            fit("/api/v1/query", &format!("{q}&time=1&time=2")),
            Err(WindowError::Repeated("time"))
        );
        assert!(matches!(
            fit("/api/v1/query", &format!("{q}&time=yesterday")),
            Err(WindowError::BadTime("time", _))
        ));
    }

    #[test]
    fn rewritten_parameters_replace_theirs_wherever_they_were() {
        let (query, body) = rewrite(
            Some("query=up&time=9000"),
            b"time=8000&step=1",
            &[("time", "2060.000".to_owned())],
        );
        assert_eq!(query, "query=up&time=2060.000");
        assert_eq!(body, b"step=1");
    }

    #[test]
    fn times_as_prometheus_reads_them() {
        assert_eq!(parse_time("1713032179.506"), Some(1713032179.506));
        assert_eq!(parse_time("2024-04-13T18:16:19.506Z"), Some(1713032179.506));
        assert_eq!(parse_time("soon"), None);
        assert_eq!(parse_time("NaN"), None);
        assert_eq!(format_time(1713032179.5), "1713032179.500");
    }
}
