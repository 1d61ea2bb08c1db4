//! Tables as CEEMS's `cacct` prints them: go-pretty's layout (v6.6), which users' eyes and
//! scripts know: columns wrapped at their widths, equal neighbouring cells of a marked row
//! merged and centred, the box characters that show where cells merge, columns with nothing in
//! any data row left out, and CSV, Markdown and HTML as go-pretty writes them.
//!
//! Only what cacct uses is here: no colours, titles, captions, pages, sorting or vertical merges.

use std::collections::BTreeSet;

mod layout;

use unicode_width::{UnicodeWidthChar as _, UnicodeWidthStr as _};

use layout::Layout;

/// The box characters of a style.
struct Box {
    bottom_left: &'static str,
    bottom_right: &'static str,
    bottom_separator: &'static str,
    left: &'static str,
    left_separator: &'static str,
    middle_horizontal: &'static str,
    middle_separator: &'static str,
    middle_vertical: &'static str,
    right: &'static str,
    right_separator: &'static str,
    top_left: &'static str,
    top_right: &'static str,
    top_separator: &'static str,
}

/// go-pretty's `StyleBoxLight`.
const LIGHT: Box = Box {
    bottom_left: "└",
    bottom_right: "┘",
    bottom_separator: "┴",
    left: "│",
    left_separator: "├",
    middle_horizontal: "─",
    middle_separator: "┼",
    middle_vertical: "│",
    right: "│",
    right_separator: "┤",
    top_left: "┌",
    top_right: "┐",
    top_separator: "┬",
};

/// go-pretty's `StyleBoxDefault`.
const ASCII: Box = Box {
    bottom_left: "+",
    bottom_right: "+",
    bottom_separator: "+",
    left: "|",
    left_separator: "+",
    middle_horizontal: "-",
    middle_separator: "+",
    middle_vertical: "|",
    right: "|",
    right_separator: "+",
    top_left: "+",
    top_right: "+",
    top_separator: "+",
};

/// Which box characters a table is drawn with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Lines (cacct's tables).
    Light,
    /// `+`, `-` and `|` (cacct's `--helpformat`).
    Ascii,
}

/// Width limits of the column whose header cell is `name` (its first such column).
#[derive(Debug, Clone)]
pub struct ColumnWidth {
    pub name: String,
    pub min: usize,
    pub max: usize,
}

#[derive(Debug, Clone, Default)]
struct Row {
    cells: Vec<String>,
    /// Equal neighbouring cells are drawn as one.
    merge: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Part {
    Header,
    #[default]
    Rows,
    Footer,
}

/// A table to fill, then print.
#[derive(Debug, Clone)]
pub struct Table {
    style: Style,
    header: Vec<Row>,
    rows: Vec<Row>,
    footer: Vec<Row>,
    /// Data rows after which a line is drawn. As in go-pretty, the same indices also separate
    /// header rows and footer rows.
    separators: BTreeSet<usize>,
    widths: Vec<ColumnWidth>,
    /// Columns with no printable text in any data row are left out.
    suppress_empty_columns: bool,
}

impl Table {
    pub fn new(style: Style) -> Table {
        Table {
            style,
            header: Vec::new(),
            rows: Vec::new(),
            footer: Vec::new(),
            separators: BTreeSet::new(),
            widths: Vec::new(),
            suppress_empty_columns: false,
        }
    }

    pub fn suppress_empty_columns(&mut self) {
        self.suppress_empty_columns = true;
    }

    pub fn set_widths(&mut self, widths: Vec<ColumnWidth>) {
        self.widths = widths;
    }

    pub fn header(&mut self, cells: Vec<String>, merge: bool) {
        self.header.push(Row { cells, merge });
    }

    pub fn row(&mut self, cells: Vec<String>, merge: bool) {
        self.rows.push(Row { cells, merge });
    }

    pub fn footer(&mut self, cells: Vec<String>) {
        self.footer.push(Row {
            cells,
            merge: false,
        });
    }

    /// A line after the last row so far (none before the first row).
    pub fn separator(&mut self) {
        if let Some(last) = self.rows.len().checked_sub(1) {
            self.separators.insert(last);
        }
    }

    /// The boxed table, one `\n` after each line.
    pub fn render(&self) -> String {
        let layout = Layout::new(self);
        let mut out = String::new();
        layout.render(&mut out);
        finish(out.split('\n').map(str::to_owned).collect())
    }

    /// The table for a terminal `columns` wide: cells unwrapped when the whole table fits,
    /// CEEMS's column widths (and its wrapping) when it does not.
    pub fn render_within(&self, columns: usize) -> String {
        let mut open = self.clone();
        for w in &mut open.widths {
            w.max = 0;
        }
        let text = open.render();
        match text.lines().all(|l| width(l) <= columns) {
            true => text,
            false => self.render(),
        }
    }

    /// go-pretty's CSV: every cell unwrapped, commas and quotes escaped with `\`.
    pub fn render_csv(&self) -> String {
        let layout = Layout::new(self);
        let mut lines = Vec::new();
        for row in layout.all_rows() {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push(',');
                }
                if cell.contains(['"', ',', '\n']) {
                    line.push('"');
                    line.push_str(&cell.replace('"', "\\\"").replace(',', "\\,"));
                    line.push('"');
                } else {
                    line.push_str(cell);
                }
            }
            for _ in row.len()..layout.columns {
                line.push(',');
            }
            lines.push(line);
        }
        finish(lines)
    }

    /// go-pretty's Markdown: the header, its `---` line, the rows and the footer.
    pub fn render_markdown(&self) -> String {
        let layout = Layout::new(self);
        let mut lines = Vec::new();
        let line = |row: &[String]| {
            let mut line = String::from("|");
            for c in 0..layout.columns {
                let cell = row.get(c).map_or("", String::as_str);
                line.push(' ');
                line.push_str(&cell.replace('|', "\\|").replace('\n', "<br/>"));
                line.push_str(" |");
            }
            line
        };
        for (i, row) in layout.header.iter().enumerate() {
            lines.push(line(row));
            if i + 1 == layout.header.len() {
                let mut sep = String::from("|");
                for c in 0..layout.columns {
                    sep.push_str(match layout.align(c, Part::Rows) {
                        Align::Right => " ---:",
                        _ => " --- ",
                    });
                    sep.push('|');
                }
                lines.push(sep);
            }
        }
        lines.extend(layout.rows.iter().map(|r| line(r)));
        lines.extend(layout.footer.iter().map(|r| line(r)));
        finish(lines)
    }

    /// go-pretty's HTML: `thead`, `tbody` and `tfoot`, merged cells as `colspan`.
    pub fn render_html(&self) -> String {
        let layout = Layout::new(self);
        let mut out = String::from("<table class=\"go-pretty-table\">\n");
        for (part, tag) in [
            (Part::Header, "thead"),
            (Part::Rows, "tbody"),
            (Part::Footer, "tfoot"),
        ] {
            let rows = layout.part(part);
            if rows.iter().all(Vec::is_empty) {
                continue;
            }
            out.push_str(&format!("  <{tag}>\n"));
            for (r, row) in rows.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
                out.push_str("  <tr>\n");
                let cell_tag = if part == Part::Header { "th" } else { "td" };
                let merge = layout.merges(part, r);
                let mut c = 0;
                while c < layout.columns {
                    let mut align = layout.align(c, part);
                    let mut span = 0;
                    if merge {
                        while c + span + 1 < row.len() && row[c] == row[c + span + 1] {
                            align = Align::Center;
                            span += 1;
                        }
                    }
                    out.push_str("    <");
                    out.push_str(cell_tag);
                    match align {
                        Align::Center => out.push_str(" align=\"center\""),
                        Align::Right => out.push_str(" align=\"right\""),
                        Align::Left => {}
                    }
                    if span > 0 {
                        out.push_str(&format!(" colspan={}", span + 1));
                    }
                    out.push('>');
                    match row.get(c).map_or("", String::as_str) {
                        "" => out.push_str("&nbsp;"),
                        text => out.push_str(&escape_html(text).replace('\n', "<br/>")),
                    }
                    out.push_str(&format!("</{cell_tag}>\n"));
                    c += span + 1;
                }
                out.push_str("  </tr>\n");
            }
            out.push_str(&format!("  </{tag}>\n"));
        }
        out.push_str("</table>");
        finish(vec![out])
    }
}

fn finish(lines: Vec<String>) -> String {
    let mut text = lines
        .iter()
        .map(|l| l.trim_end())
        .collect::<Vec<_>>()
        .join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    text
}

fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&#34;")
        .replace('\'', "&#39;")
}

/// Display width, as go-pretty counts it.
fn width(text: &str) -> usize {
    text.width()
}

fn longest_line(text: &str) -> usize {
    text.split('\n').map(width).max().unwrap_or(0)
}

/// go-pretty's `WrapText`: each line's words hard-wrapped at `limit` columns.
fn wrap(text: &str, limit: usize) -> String {
    if limit == 0 {
        return String::new();
    }
    if width(text) <= limit {
        return text.to_owned();
    }
    let mut out = String::new();
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let mut used = 0;
        for (w, word) in words.iter().enumerate() {
            if used > 0 {
                out.push(' ');
                used += 1;
            }
            let word_width = width(word);
            if used + word_width <= limit {
                out.push_str(word);
                used += word_width;
            } else {
                for ch in word.chars() {
                    if used == limit {
                        out.push('\n');
                        used = 0;
                    }
                    out.push(ch);
                    used += ch.width().unwrap_or(0);
                }
            }
            if used == limit && w + 1 < words.len() {
                out.push('\n');
                used = 0;
            }
        }
    }
    out
}

/// Go's `strings.ToUpper`, one character for one.
fn upper(text: &str) -> String {
    text.chars()
        .map(|c| {
            let mut up = c.to_uppercase();
            match (up.next(), up.next()) {
                (Some(u), None) => u,
                _ => c,
            }
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Align {
    Left,
    Center,
    Right,
}

impl Align {
    fn apply(self, text: &str, limit: usize) -> String {
        let text = match self {
            Align::Left => text.trim_end_matches(' '),
            Align::Right => text.trim_start_matches(' '),
            Align::Center => text.trim_matches(' '),
        };
        let pad = limit.saturating_sub(width(text));
        match self {
            Align::Left => format!("{text}{}", " ".repeat(pad)),
            Align::Right => format!("{}{text}", " ".repeat(pad)),
            Align::Center => format!("{}{text}{}", " ".repeat(pad - pad / 2), " ".repeat(pad / 2)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cells(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_terminal_wide_enough_gets_cells_unwrapped() {
        let mut t = Table::new(Style::Light);
        t.set_widths(vec![ColumnWidth {
            name: "Name".into(),
            min: 3,
            max: 5,
        }]);
        t.header(cells(&["Name"]), false);
        t.row(cells(&["a-long-job-name"]), false);
        let wide = t.render_within(80);
        assert!(wide.contains("│ a-long-job-name │"), "{wide}");
        assert_eq!(wide.lines().count(), 5, "{wide}");
        // Too narrow for the whole table: CEEMS's widths, wrapped.
        assert_eq!(t.render_within(10), t.render());
        assert!(t.render().contains("│ a-lon │"));
    }

    #[test]
    fn words_are_hard_wrapped_as_go_pretty_does() {
        assert_eq!(wrap("CANCELLED by 1001", 5), "CANCE\nLLED \nby 10\n01");
        assert_eq!(wrap("CPU Mem. Usage(%)", 6), "CPU Me\nm. Usa\nge(%)");
        assert_eq!(wrap("short", 8), "short");
    }

    #[test]
    fn a_merged_header_is_centred_over_its_columns_and_the_box_shows_it() {
        let mut t = Table::new(Style::Light);
        t.header(cells(&["Job", "Energy", "Energy"]), true);
        t.header(cells(&["", "a", "b"]), false);
        t.row(cells(&["1", "10.5", "20.25"]), false);
        // No separator was asked between the header rows: none is drawn.
        let want = "\
┌─────┬──────────────┐
│ JOB │    ENERGY    │
│     │ A    │ B     │
├─────┼──────┼───────┤
│ 1   │ 10.5 │ 20.25 │
└─────┴──────┴───────┘
";
        assert_eq!(t.render(), want);
    }

    #[test]
    fn empty_columns_are_left_out_and_a_merged_row_spans_the_rest() {
        let mut t = Table::new(Style::Light);
        t.suppress_empty_columns();
        t.header(cells(&["Id", "Name", "User"]), true);
        t.row(cells(&["7", "", "alice"]), false);
        t.separator();
        t.row(cells(&["Summary", "", "", ""]), true);
        let text = t.render();
        assert!(!text.contains("NAME"), "{text}");
        assert!(text.contains("│ Summary │       │"), "{text}");
        assert!(text.ends_with("└─────────┴───────┘\n"), "{text}");
        assert_eq!(
            t.render_csv(),
            "Id,User\n7,alice\nSummary,\n",
            "CSV keeps the shown columns"
        );
    }

    #[test]
    fn the_ascii_style_draws_with_plus_and_minus() {
        let mut t = Table::new(Style::Ascii);
        t.header(cells(&["Field", "Description"]), false);
        t.row(cells(&["jobID", "Job ID"]), false);
        assert_eq!(
            t.render(),
            "+-------+-------------+\n| FIELD | DESCRIPTION |\n+-------+-------------+\n| jobID | Job ID      |\n+-------+-------------+\n"
        );
    }

    #[test]
    fn markdown_and_html_escape_what_their_syntax_reads() {
        let mut t = Table::new(Style::Light);
        t.header(cells(&["A|B"]), false);
        t.row(cells(&["<x>"]), false);
        assert_eq!(t.render_markdown(), "| A\\|B |\n| --- |\n| <x> |\n");
        assert!(t.render_html().contains("<td>&lt;x&gt;</td>"));
    }
}
