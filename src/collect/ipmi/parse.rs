//! Parsers for the DCMI power readings printed by FreeIPMI's `ipmi-dcmi`, `ipmitool`,
//! `ipmiutil` and Cray's `capmc`. None of them panics, whatever the input.

use serde::Deserialize;

use crate::host::ParseError;

/// One DCMI power reading, in watts. Tools may leave fields out.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PowerReading {
    pub current: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub avg: Option<f64>,
}

impl PowerReading {
    pub fn is_empty(&self) -> bool {
        self.current.is_none() && self.min.is_none() && self.max.is_none() && self.avg.is_none()
    }
}

/// Which parser reads a tool's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `ipmi-dcmi`, `ipmitool` and `ipmiutil`: `label: N Watts` lines, told apart by label.
    Text,
    /// `capmc get_system_power`: a JSON object.
    CapmcJson,
}

#[derive(Clone, Copy)]
enum Field {
    Current,
    Min,
    Max,
    Avg,
}

/// Which reading a label names, across the three tools' spellings.
fn field_of(label: &str) -> Option<Field> {
    const PREFIXES: &[(&str, Field)] = &[
        ("current power", Field::Current),
        ("instantaneous power reading", Field::Current),
        ("minimum", Field::Min),
        ("min power", Field::Min),
        ("maximum", Field::Max),
        ("max power", Field::Max),
        ("average", Field::Avg),
        ("avg power", Field::Avg),
    ];
    PREFIXES
        .iter()
        .find(|(p, _)| label.starts_with(p))
        .map(|(_, f)| *f)
}

/// `332 Watts` → 332; a value not in watts is not a reading.
fn watts(line: usize, value: &str) -> Result<Option<f64>, ParseError> {
    let mut words = value.split_whitespace();
    let (Some(number), Some(unit)) = (words.next(), words.next()) else {
        return Ok(None);
    };
    if !unit.eq_ignore_ascii_case("watts") {
        return Ok(None);
    }
    let w: f64 = number
        .parse()
        .map_err(|_| ParseError::new(line, format!("`{number}` is not a number of watts")))?;
    if !w.is_finite() || w < 0.0 {
        return Err(ParseError::new(
            line,
            format!("`{number}` is not a valid power"),
        ));
    }
    Ok(Some(w))
}

/// Reads the text output of `ipmi-dcmi --get-system-power-statistics`,
/// `ipmitool dcmi power reading` or `ipmiutil dcmi power`.
pub fn text(output: &str) -> Result<PowerReading, ParseError> {
    let mut reading = PowerReading::default();
    for (i, line) in output.lines().enumerate() {
        let Some((label, value)) = line.split_once(':') else {
            continue;
        };
        let label = label.trim().to_ascii_lowercase();
        let value = value.trim();
        if label == "power measurement" || label == "power reading state is" {
            let state = value.to_ascii_lowercase();
            if !(state.starts_with("active") || state.starts_with("activated")) {
                return Err(ParseError::new(
                    i + 1,
                    format!("the BMC reports its power measurement as `{value}`"),
                ));
            }
            continue;
        }
        let Some(field) = field_of(&label) else {
            continue;
        };
        let Some(w) = watts(i + 1, value)? else {
            continue;
        };
        let slot = match field {
            Field::Current => &mut reading.current,
            Field::Min => &mut reading.min,
            Field::Max => &mut reading.max,
            Field::Avg => &mut reading.avg,
        };
        // ipmiutil prints a second "Sampling period" block; the first reading wins.
        if slot.is_none() {
            *slot = Some(w);
        }
    }
    if reading.current.is_none() {
        return Err(ParseError::new(0, "no current power reading in the output"));
    }
    Ok(reading)
}

#[derive(Deserialize)]
struct CapmcPower {
    #[serde(default)]
    e: i64,
    #[serde(default)]
    err_msg: String,
    avg: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
}

/// Reads `capmc get_system_power -w 600`. capmc gives statistics over the window only; the
/// average stands in for the current power, as in CEEMS.
pub fn capmc(output: &str) -> Result<PowerReading, ParseError> {
    let p: CapmcPower = serde_json::from_str(output.trim())
        .map_err(|e| ParseError::new(e.line(), format!("capmc output is not valid JSON: {e}")))?;
    if p.e != 0 {
        return Err(ParseError::new(
            0,
            format!("capmc reported error {}: {}", p.e, p.err_msg),
        ));
    }
    for v in [p.avg, p.min, p.max].into_iter().flatten() {
        if !v.is_finite() || v < 0.0 {
            return Err(ParseError::new(0, format!("capmc reported power {v}")));
        }
    }
    let reading = PowerReading {
        current: p.avg,
        min: p.min,
        max: p.max,
        avg: p.avg,
    };
    if reading.is_empty() {
        return Err(ParseError::new(0, "capmc output holds no power value"));
    }
    Ok(reading)
}

pub fn parse(format: Format, output: &str) -> Result<PowerReading, ParseError> {
    match format {
        Format::Text => text(output),
        Format::CapmcJson => capmc(output),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(path: &str) -> String {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/compat/fixtures/ipmi");
        std::fs::read_to_string(root.join(path)).unwrap()
    }

    fn full(current: f64, min: f64, max: f64, avg: f64) -> PowerReading {
        PowerReading {
            current: Some(current),
            min: Some(min),
            max: Some(max),
            avg: Some(avg),
        }
    }

    #[test]
    fn the_four_tools_captured_outputs() {
        assert_eq!(
            text(&fixture(
                "freeipmi/ipmi-dcmi_--get-system-power-statistics.txt"
            )),
            Ok(full(332.0, 68.0, 504.0, 348.0))
        );
        assert_eq!(
            text(&fixture("openipmi/ipmitool_dcmi_power_reading.txt")),
            Ok(full(2578.0, 2118.0, 4294.0, 2567.0))
        );
        assert_eq!(
            text(&fixture("ipmiutils/ipmiutil_dcmi_power.txt")),
            Ok(full(49.0, 6.0, 304.0, 49.0))
        );
        assert_eq!(
            capmc(&fixture("capmc/capmc_get_system_power_-w_600.txt")),
            Ok(full(5942.0, 5748.0, 6132.0, 5942.0))
        );
    }

    #[test]
    fn ipmitool_timestamp_and_period_on_one_line() {
        let out = "    Instantaneous power reading:   120 Watts\n    IPMI timestamp:   Wed Feb 14 17:09:10 2024    Sampling period:  00000300 Seconds.\n    Power reading state is:   activated\n";
        assert_eq!(text(out).unwrap().current, Some(120.0));
    }

    #[test]
    fn deactivated_and_malformed_readings_are_errors() {
        let off = "    Instantaneous power reading:   0 Watts\n    Power reading state is:   deactivated\n";
        let err = text(off).unwrap_err();
        assert!(err.message.contains("deactivated"), "{err}");
        let na = "Current Power : Not Available\nPower Measurement : Not Available\n";
        assert!(text(na).is_err());
        let bad = "Current Power : 12x Watts\n";
        assert!(text(bad).unwrap_err().message.contains("12x"));
        assert!(text("").is_err());
        assert!(text("Current Power : -5 Watts\n").is_err());
        assert!(capmc("{").is_err());
        assert!(capmc("{\"e\":52,\"err_msg\":\"no such node\"}")
            .unwrap_err()
            .message
            .contains("no such node"));
        assert!(capmc("{\"e\":0}").is_err());
        assert!(capmc("[]").is_err());
    }

    #[test]
    fn a_power_limit_line_is_not_a_reading() {
        let out = "  Current Power:  49 Watts\n  Power Limit:       896 Watts (inactive)\n";
        assert_eq!(
            text(out),
            Ok(PowerReading {
                current: Some(49.0),
                ..Default::default()
            })
        );
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in "\\\\PC*") {
            let _ = text(&s);
            let _ = capmc(&s);
        }
    }
}
