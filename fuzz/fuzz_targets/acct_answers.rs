#![no_main]
//! Fuzzes what `cacct` reads and draws: the API server's units and usage (any JSON, any text in
//! any field, sources of any name), drawn as its table, CSV, Markdown and HTML; its config's
//! `tsdb.queries` (any YAML) and the PromQL made of them; and tables of arbitrary cells, widths
//! and merges straight through the layout.

use ceems::acct::table::{ColumnWidth, Style, Table};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 4 == 0 {
        let Ok(serde_json::Value::Array(units)) = serde_json::from_slice(rest) else {
            return;
        };
        let t = ceems::acct::table(
            &units,
            &units,
            "usr1",
            &["usr2".to_owned()],
            &[],
            mode & 8 == 0,
        );
        let _ = (
            t.render(),
            t.render_csv(),
            t.render_markdown(),
            t.render_html(),
        );
        return;
    }
    if mode % 4 == 2 {
        if let Ok((queries, _)) = ceems::acct::queries::parse_yaml(&String::from_utf8_lossy(rest)) {
            for q in &queries {
                let _ = q.promql(&["1", "2[3]"], i64::from(mode) - 100);
            }
            let units = vec![serde_json::json!({"uuid": "1", "series:x": "[]"})];
            let instant: Vec<_> = queries
                .into_iter()
                .filter(|q| q.kind == ceems::acct::queries::Kind::Instant)
                .collect();
            let _ = ceems::acct::table(&units, &[], "usr1", &[], &instant, true).render();
        }
        return;
    }
    // Lines are rows (the first two the header), tabs split cells; the mode's bits choose the
    // widths and which rows merge.
    let text = String::from_utf8_lossy(rest);
    let mut t = Table::new(if mode & 2 == 0 {
        Style::Light
    } else {
        Style::Ascii
    });
    if mode & 4 != 0 {
        t.suppress_empty_columns();
    }
    let mut widths = Vec::new();
    for (i, line) in text.split('\n').enumerate() {
        let cells: Vec<String> = line.split('\t').map(str::to_owned).collect();
        let merge = (mode >> (i % 8)) & 1 == 1;
        if i == 0 {
            for (c, cell) in cells.iter().enumerate() {
                widths.push(ColumnWidth {
                    name: cell.clone(),
                    min: c % 4,
                    max: (usize::from(mode) + c) % 9,
                });
            }
        }
        match i {
            0 | 1 => t.header(cells, merge),
            i if i % 5 == 4 => t.footer(cells),
            _ => {
                t.row(cells, merge);
                if mode & 8 != 0 {
                    t.separator();
                }
            }
        }
    }
    t.set_widths(widths);
    let _ = (
        t.render(),
        t.render_csv(),
        t.render_markdown(),
        t.render_html(),
    );
});
