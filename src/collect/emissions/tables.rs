//! The static tables shipped in the binary: Our World in Data's yearly carbon intensity of
//! electricity (CC BY 4.0) and the ISO 3166-1 country codes.

use std::collections::HashMap;

use serde::Deserialize;

const OWID_CSV: &str = include_str!("../../../data/owid-carbon-intensity.csv");
const ISO_JSON: &str = include_str!("../../../data/iso-3166-1.json");

#[derive(Debug, Clone, Deserialize)]
pub struct Country {
    pub alpha_2: String,
    pub alpha_3: String,
    pub name: String,
}

#[derive(Deserialize)]
struct IsoFile {
    #[serde(rename = "3166-1")]
    countries: Vec<Country>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("line {line}: {message}")]
pub struct TableError {
    pub line: usize,
    pub message: String,
}

/// ISO 3166-1 countries.
pub fn countries(json: &str) -> Result<Vec<Country>, TableError> {
    serde_json::from_str::<IsoFile>(json)
        .map(|f| f.countries)
        .map_err(|e| TableError {
            line: e.line(),
            message: e.to_string(),
        })
}

/// One row of the OWID table.
#[derive(Debug, Clone, PartialEq)]
pub struct IntensityRow<'a> {
    pub entity: &'a str,
    pub code: &'a str,
    pub year: u16,
    pub g_per_kwh: f64,
}

/// Parses OWID's `Entity,Code,Year,value` CSV. Entity names may contain commas, so fields are
/// split from the right.
pub fn owid_rows(csv: &str) -> Result<Vec<IntensityRow<'_>>, TableError> {
    let mut rows = Vec::new();
    for (i, line) in csv.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let err = |message: String| TableError {
            line: i + 1,
            message,
        };
        let mut parts = line.rsplitn(4, ',');
        let (Some(value), Some(year), Some(code), Some(entity)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(err("expected Entity,Code,Year,value".into()));
        };
        let year = year
            .trim()
            .parse()
            .map_err(|_| err(format!("year `{year}` is not a number")))?;
        let g_per_kwh: f64 = value
            .trim()
            .parse()
            .map_err(|_| err(format!("value `{value}` is not a number")))?;
        if !g_per_kwh.is_finite() || g_per_kwh < 0.0 {
            return Err(err(format!("value `{value}` is not a valid intensity")));
        }
        rows.push(IntensityRow {
            entity,
            code: code.trim(),
            year,
            g_per_kwh,
        });
    }
    Ok(rows)
}

/// The latest intensity of each ISO country: alpha-2 code → (name, g/kWh).
pub fn latest_by_country(
    rows: &[IntensityRow<'_>],
    countries: &[Country],
) -> HashMap<String, (String, f64)> {
    let by_alpha3: HashMap<&str, &Country> =
        countries.iter().map(|c| (c.alpha_3.as_str(), c)).collect();
    let mut latest: HashMap<&str, (u16, f64)> = HashMap::new();
    for r in rows {
        if !by_alpha3.contains_key(r.code) {
            // Regions (OWID_WRL, "ASEAN (Ember)") are not countries.
            continue;
        }
        let e = latest.entry(r.code).or_insert((r.year, r.g_per_kwh));
        if r.year >= e.0 {
            *e = (r.year, r.g_per_kwh);
        }
    }
    latest
        .into_iter()
        .filter_map(|(code, (_, v))| {
            let c = by_alpha3.get(code)?;
            Some((c.alpha_2.clone(), (c.name.clone(), v)))
        })
        .collect()
}

/// The shipped tables, parsed.
pub struct Shipped {
    pub countries: Vec<Country>,
    pub owid: HashMap<String, (String, f64)>,
    /// OWID's world figure of its latest year.
    pub world: f64,
}

pub fn shipped() -> Result<Shipped, TableError> {
    let countries = countries(ISO_JSON)?;
    let rows = owid_rows(OWID_CSV)?;
    let owid = latest_by_country(&rows, &countries);
    let world = rows
        .iter()
        .filter(|r| r.code == "OWID_WRL")
        .max_by_key(|r| r.year)
        .map(|r| r.g_per_kwh)
        .ok_or(TableError {
            line: 0,
            message: "no world (OWID_WRL) row".into(),
        })?;
    Ok(Shipped {
        countries,
        owid,
        world,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_tables_parse_and_hold_the_latest_year() {
        let s = shipped().unwrap();
        assert!(s.countries.len() > 240);
        assert!(s.owid.len() > 150, "{}", s.owid.len());
        let (name, fr) = &s.owid["FR"];
        assert_eq!(name, "France");
        // France's grid is mostly nuclear: tens of grams, not hundreds.
        assert!(*fr > 10.0 && *fr < 120.0, "{fr}");
        assert!(s.world > 400.0 && s.world < 550.0, "{}", s.world);
        let rows = owid_rows(OWID_CSV).unwrap();
        let fra_latest = rows
            .iter()
            .filter(|r| r.code == "FRA")
            .max_by_key(|r| r.year)
            .unwrap();
        assert_eq!(fra_latest.g_per_kwh, *fr);
    }

    #[test]
    fn malformed_rows_are_errors_with_their_line() {
        let e = owid_rows("Entity,Code,Year,v\nFrance,FRA,20x4,56\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(owid_rows("h\nFrance,FRA,2024,-1\n").is_err());
        assert!(owid_rows("h\nonly,two\n").is_err());
        let ok = owid_rows("h\nBonaire, Sint Eustatius and Saba,BES,2020,100\n").unwrap();
        assert_eq!(ok[0].entity, "Bonaire, Sint Eustatius and Saba");
        assert!(countries("{").is_err());
    }
}
