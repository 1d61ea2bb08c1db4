//! `ceems tool report waste`: the stats-server's ranking of waste (`/api/v1/waste/admin`) as
//! a terminal table or CSV, the same figures in the same order.

use serde_json::Value;

/// The columns: (the API's field, the table's heading).
const COLUMNS: &[(&str, &str)] = &[
    ("idle_gpu_hours", "idle GPU-h"),
    ("lost_cpu_hours", "lost CPU-h"),
    ("unused_memory_tb_hours", "unused mem TB-h"),
    ("overrequested_core_hours", "unreached limit core-h"),
    ("waste_energy_kwh", "waste kWh"),
    ("waste_emissions_g", "waste g CO2e"),
];

/// The rows of an API answer, or why there are none.
pub fn rows(answer: &str) -> Result<Vec<Value>, String> {
    let v: Value = serde_json::from_str(answer).map_err(|e| format!("not JSON: {e}"))?;
    if v["status"] != "success" {
        return Err(v["error"]
            .as_str()
            .unwrap_or("the stats-server refused")
            .to_owned());
    }
    v["data"]
        .as_array()
        .cloned()
        .ok_or_else(|| "no data in the answer".to_owned())
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => format!("{f:.2}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// The group's name: whichever of the keys `by` gave.
fn key(row: &Value, by: &str) -> String {
    let field = match by {
        "user" => "username",
        other => other,
    };
    text(&row[field])
}

/// CSV with a header of the API's field names; a figure no power source measured is empty.
pub fn csv(rows: &[Value], by: &str) -> String {
    let quote = |s: String| match s.contains([',', '"', '\n']) {
        true => format!("\"{}\"", s.replace('"', "\"\"")),
        false => s,
    };
    let mut out = format!("cluster_id,{by},num_units");
    for (f, _) in COLUMNS {
        out.push(',');
        out.push_str(f);
    }
    out.push('\n');
    for r in rows {
        let mut line = vec![
            quote(text(&r["cluster_id"])),
            quote(key(r, by)),
            text(&r["num_units"]),
        ];
        line.extend(COLUMNS.iter().map(|(f, _)| match &r[*f] {
            Value::Number(n) => n.to_string(),
            _ => String::new(),
        }));
        out.push_str(&line.join(","));
        out.push('\n');
    }
    out
}

/// A table with aligned columns; a figure no power source measured shows `-`.
pub fn table(rows: &[Value], by: &str) -> String {
    let mut head = vec!["cluster".to_owned(), by.to_owned(), "jobs".to_owned()];
    head.extend(COLUMNS.iter().map(|(_, h)| (*h).to_owned()));
    let mut lines = vec![head];
    for r in rows {
        let mut line = vec![text(&r["cluster_id"]), key(r, by), text(&r["num_units"])];
        line.extend(COLUMNS.iter().map(|(f, _)| match &r[*f] {
            Value::Null => "-".to_owned(),
            v => text(v),
        }));
        // A name is the user's own text: no control characters reach the terminal.
        lines.push(
            line.into_iter()
                .map(|c| c.chars().filter(|c| !c.is_control()).collect())
                .collect(),
        );
    }
    let widths: Vec<usize> = (0..lines[0].len())
        .map(|i| {
            lines
                .iter()
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for l in &lines {
        let cells: Vec<String> = l
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| match i < 2 {
                true => format!("{c:<w$}"),
                false => format!("{c:>w$}"),
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    if rows.is_empty() {
        out.push_str("(no job ended in the window)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_and_the_csv_hold_the_same_figures_and_say_what_was_not_measured() {
        let answer = r#"{"status":"success","data":[
            {"cluster_id":"lab","username":"alice","num_units":1,"idle_gpu_hours":20.0,"lost_cpu_hours":36.0,"unused_memory_tb_hours":0.9,"overrequested_core_hours":40.0,"waste_energy_kwh":14.0,"waste_emissions_g":933.333},
            {"cluster_id":"lab","username":"car,ol","num_units":2,"idle_gpu_hours":2.0,"lost_cpu_hours":2.0,"unused_memory_tb_hours":0.0,"overrequested_core_hours":0.0,"waste_energy_kwh":null,"waste_emissions_g":null}]}"#;
        let rows = rows(answer).unwrap();
        let csv = csv(&rows, "user");
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "cluster_id,user,num_units,idle_gpu_hours,lost_cpu_hours,unused_memory_tb_hours,overrequested_core_hours,waste_energy_kwh,waste_emissions_g");
        assert_eq!(lines[1], "lab,alice,1,20.0,36.0,0.9,40.0,14.0,933.333");
        assert_eq!(lines[2], "lab,\"car,ol\",2,2.0,2.0,0.0,0.0,,");
        let table = table(&rows, "user");
        assert!(table.lines().nth(1).unwrap().contains("20.00"), "{table}");
        assert!(
            table.lines().nth(2).unwrap().trim_end().ends_with('-'),
            "{table}"
        );
        assert!(rows_error().contains("admin"));
    }

    fn rows_error() -> String {
        rows(r#"{"status":"error","errorType":"forbidden","error":"admin only"}"#).unwrap_err()
    }
}
