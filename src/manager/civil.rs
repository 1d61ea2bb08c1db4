//! UTC calendar arithmetic for the times managers print without a library's help: LSF's
//! and PBS's `Apr 12 18:10:00 2026`, Kubernetes' RFC 3339 `2026-04-12T18:10:00Z`.

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// `Apr 12 18:10:00 2026` or `Sun Apr 12 17:23:38 2026` (UTC) → epoch seconds: `asctime(3)`
/// times, as LSF and PBS print them (run with `TZ=UTC`). A trailing flag bjobs adds to
/// estimated times (`… 2026 L`) is ignored.
pub fn parse_asctime(text: &str) -> Option<i64> {
    let mut words: Vec<&str> = text.split_whitespace().collect();
    if words
        .first()
        .is_some_and(|w| w.len() == 3 && w.parse::<u32>().is_err())
        && words.get(1).is_some_and(|w| MONTHS.contains(w))
    {
        words.remove(0);
    }
    let [month, day, clock, year, ..] = words[..] else {
        return None;
    };
    let month = MONTHS.iter().position(|m| *m == month)? as i64 + 1;
    let day: i64 = day.parse().ok().filter(|d| (1..=31).contains(d))?;
    let year: i64 = year.parse().ok().filter(|y| (1970..=9999).contains(y))?;
    let mut hms = clock.split(':').map(|p| p.parse::<i64>().ok());
    let (h, m, s) = (hms.next()??, hms.next()??, hms.next()??);
    if hms.next().is_some() || h > 23 || m > 59 || s > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60 + s)
}

/// Days from 1970-01-01 to the civil date (proleptic Gregorian).
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date `(year, month, day)` of days since 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// RFC 3339 (`2026-04-12T18:10:00Z`, `…T18:10:00.5+02:00`) → epoch seconds.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let t = text.trim();
    let (date, rest) = t.split_once(['T', 't', ' '])?;
    let mut d = date.splitn(3, '-');
    // Years a record can hold: a larger one would overflow the day arithmetic.
    let year: i64 = d.next()?.parse().ok().filter(|y| (1..=9999).contains(y))?;
    let month: i64 = d.next()?.parse().ok().filter(|m| (1..=12).contains(m))?;
    let day: i64 = d.next()?.parse().ok().filter(|d| (1..=31).contains(d))?;
    let zone_at = rest.find(['Z', 'z', '+', '-'])?;
    let (clock, zone) = rest.split_at(zone_at);
    let clock = clock.split('.').next()?;
    let mut c = clock.splitn(3, ':');
    let h: i64 = c.next()?.parse().ok().filter(|h| (0..24).contains(h))?;
    let m: i64 = c.next()?.parse().ok().filter(|m| (0..60).contains(m))?;
    let s: i64 = c.next()?.parse().ok().filter(|s| (0..=60).contains(s))?;
    let offset = match zone {
        "Z" | "z" => 0,
        z => {
            let sign = if z.starts_with('-') { -1 } else { 1 };
            let (oh, om) = z[1..].split_once(':')?;
            sign * (oh.parse::<i64>().ok()? * 3600 + om.parse::<i64>().ok()? * 60)
        }
    };
    Some(days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60 + s - offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_both_ways_and_rfc3339() {
        for days in [-1, 0, 19_782, 20_000, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(parse_rfc3339("2024-02-29T12:00:00Z"), Some(1_709_208_000));
        assert_eq!(
            parse_rfc3339("2024-02-29T14:00:00.25+02:00"),
            Some(1_709_208_000)
        );
        for bad in [
            "",
            "2024-02-29",
            "2024-13-01T00:00:00Z",
            "2024-02-29T25:00:00Z",
            "2024-02-29T12:00:00",
            "yesterday",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}
