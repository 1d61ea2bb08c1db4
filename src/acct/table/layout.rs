//! How go-pretty lays a table out and draws it: each column's width (merged cells shared
//! among their columns), the hidden columns, and each line with the box characters that show
//! where cells merge.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{longest_line, upper, width, wrap, Align, Box, Part, Row, Style, Table, ASCII, LIGHT};

/// Where a line is drawn, as go-pretty's render hint says it.
#[derive(Debug, Clone, Copy, Default)]
struct Hint {
    part: Part,
    border_top: bool,
    border_bottom: bool,
    first_row: bool,
    last_row: bool,
    separator: bool,
    /// 1-based; 0 before the first.
    row_number: isize,
}

/// A table ready to draw: cells as text, the hidden columns gone, each column's width.
pub(super) struct Layout<'a> {
    pub(super) table: &'a Table,
    pub(super) header: Vec<Vec<String>>,
    pub(super) rows: Vec<Vec<String>>,
    pub(super) footer: Vec<Vec<String>>,
    pub(super) columns: usize,
    /// Width limits by column, after hiding.
    pub(super) limits: HashMap<usize, (usize, usize)>,
    /// Columns that some data row has (go-pretty right-aligns the others, as numbers).
    pub(super) textual: Vec<bool>,
    pub(super) lengths: Vec<usize>,
    pub(super) box_: &'static Box,
}

impl<'a> Layout<'a> {
    pub(super) fn new(table: &'a Table) -> Layout<'a> {
        let text = |rows: &[Row]| -> Vec<Vec<String>> {
            rows.iter()
                .map(|r| {
                    r.cells
                        .iter()
                        .map(|c| c.replace('\t', "    ").replace("\r\n", "\n"))
                        .collect()
                })
                .collect()
        };
        let (header, rows, footer) = (text(&table.header), text(&table.rows), text(&table.footer));
        let columns = widest(&header, &rows, &footer);
        let mut limits: HashMap<usize, (usize, usize)> = HashMap::new();
        for w in &table.widths {
            let found = header
                .iter()
                .find_map(|r| r.iter().position(|c| *c == w.name));
            if let Some(col) = found {
                limits.insert(col, (w.min, w.max));
            }
        }
        let hidden: Vec<bool> = (0..columns)
            .map(|c| table.suppress_empty_columns && empty_column(&rows, c))
            .collect();
        let keep = |rows: Vec<Vec<String>>| -> Vec<Vec<String>> {
            rows.into_iter()
                .map(|r| {
                    r.into_iter()
                        .enumerate()
                        .filter(|(c, _)| !hidden[*c])
                        .map(|(_, cell)| cell)
                        .collect()
                })
                .collect()
        };
        let new_index: Vec<Option<usize>> = {
            let mut next = 0;
            hidden
                .iter()
                .map(|h| {
                    (!h).then(|| {
                        next += 1;
                        next - 1
                    })
                })
                .collect()
        };
        let limits = limits
            .into_iter()
            .filter_map(|(c, l)| new_index[c].map(|n| (n, l)))
            .collect();
        let (header, rows, footer) = (keep(header), keep(rows), keep(footer));
        let columns = widest(&header, &rows, &footer);
        let longest_data_row = rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut layout = Layout {
            table,
            header,
            rows,
            footer,
            columns,
            limits,
            textual: (0..columns).map(|c| c < longest_data_row).collect(),
            lengths: vec![0; columns],
            box_: match table.style {
                Style::Light => &LIGHT,
                Style::Ascii => &ASCII,
            },
        };
        layout.measure();
        layout
    }

    pub(super) fn all_rows(&self) -> impl Iterator<Item = &Vec<String>> {
        self.header.iter().chain(&self.rows).chain(&self.footer)
    }

    pub(super) fn part(&self, part: Part) -> &[Vec<String>] {
        match part {
            Part::Header => &self.header,
            Part::Rows => &self.rows,
            Part::Footer => &self.footer,
        }
    }

    /// Row `index` (0-based) of `part`, or none.
    fn row(&self, part: Part, index: isize) -> &[String] {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.part(part).get(i))
            .map_or(&[], Vec::as_slice)
    }

    /// Whether row `index` of `part` merges equal neighbours.
    pub(super) fn merges(&self, part: Part, index: usize) -> bool {
        let rows = match part {
            Part::Header => &self.table.header,
            Part::Rows => &self.table.rows,
            Part::Footer => &self.table.footer,
        };
        rows.get(index).is_some_and(|r| r.merge)
    }

    /// go-pretty's row config of a hint: its row's, the first one's before the first.
    fn hint_merges(&self, part: Part, row_number: isize) -> bool {
        self.merges(part, usize::try_from(row_number - 1).unwrap_or(0))
    }

    fn max_width(&self, col: usize) -> usize {
        self.limits.get(&col).map_or(0, |l| l.1)
    }

    pub(super) fn align(&self, col: usize, _part: Part) -> Align {
        if self.textual.get(col).copied().unwrap_or(false) {
            Align::Left
        } else {
            Align::Right
        }
    }

    fn measure(&mut self) {
        let mut merged: BTreeMap<usize, BTreeMap<usize, usize>> = BTreeMap::new();
        let mut lengths = vec![0; self.columns];
        for part in [Part::Header, Part::Rows, Part::Footer] {
            for (r, row) in self.part(part).iter().enumerate() {
                let spans = match self.merges(part, r) {
                    true => merged_spans(row, self.columns),
                    false => BTreeMap::new(),
                };
                let mut c = 0;
                while c < row.len() {
                    let mut len = longest_line(&row[c]);
                    let max = self.max_width(c);
                    if max > 0 && max < len {
                        len = max;
                    }
                    if let Some(&end) = spans.get(&c) {
                        let longest = merged.entry(end).or_default().entry(c).or_insert(0);
                        *longest = (*longest).max(len);
                        c = end;
                    } else if len > lengths[c] {
                        lengths[c] = len;
                    }
                    c += 1;
                }
            }
        }
        self.lengths = lengths;
        for (c, len) in self.lengths.iter_mut().enumerate() {
            let min = self.limits.get(&c).map_or(0, |l| l.0);
            if min > 0 && *len < min {
                *len = min;
            }
        }
        self.rebalance(&merged);
    }

    /// go-pretty's share of a merged cell's width among its columns that are narrower than
    /// their share.
    fn rebalance(&mut self, merged: &BTreeMap<usize, BTreeMap<usize, usize>>) {
        let separator = width(self.box_.middle_separator) as isize;
        for (&end, starts) in merged {
            for (&start, &len) in starts.iter().rev() {
                let mut balance: BTreeSet<usize> = (start..=end).collect();
                let mut remaining = len as isize - (balance.len() as isize - 1) * separator;
                loop {
                    if remaining <= 0 {
                        balance.clear();
                        break;
                    }
                    let share = remaining / balance.len() as isize;
                    let wide: Vec<usize> = balance
                        .iter()
                        .copied()
                        .filter(|&c| self.lengths[c] as isize >= share)
                        .collect();
                    if wide.is_empty() {
                        break;
                    }
                    for c in wide {
                        remaining -= self.lengths[c] as isize;
                        balance.remove(&c);
                    }
                    if balance.is_empty() {
                        break;
                    }
                }
                if balance.is_empty() {
                    continue;
                }
                for &c in &balance {
                    remaining -= self.lengths[c] as isize;
                }
                let mut left = balance.len() as isize;
                for &c in &balance {
                    let add = remaining / left;
                    self.lengths[c] = (self.lengths[c] as isize + add).max(0) as usize;
                    remaining -= add;
                    left -= 1;
                }
            }
        }
    }

    pub(super) fn render(&self, out: &mut String) {
        if self.columns == 0 {
            return;
        }
        self.separator_line(
            out,
            Hint {
                part: if self.header.is_empty() {
                    Part::Rows
                } else {
                    Part::Header
                },
                border_top: true,
                ..Hint::default()
            },
        );
        if !self.header.is_empty() {
            self.rows_of(out, Part::Header);
            self.separator_line(
                out,
                Hint {
                    part: Part::Header,
                    last_row: true,
                    row_number: self.header.len() as isize,
                    ..Hint::default()
                },
            );
        }
        self.rows_of(out, Part::Rows);
        if !self.footer.is_empty() {
            self.separator_line(
                out,
                Hint {
                    part: Part::Footer,
                    first_row: true,
                    ..Hint::default()
                },
            );
            self.rows_of(out, Part::Footer);
        }
        let bottom = match self.footer.is_empty() {
            true => (Part::Rows, self.rows.len()),
            false => (Part::Footer, self.footer.len()),
        };
        self.separator_line(
            out,
            Hint {
                part: bottom.0,
                border_bottom: true,
                row_number: bottom.1 as isize,
                ..Hint::default()
            },
        );
    }

    fn rows_of(&self, out: &mut String, part: Part) {
        let rows = self.part(part);
        for (r, row) in rows.iter().enumerate() {
            let mut hint = Hint {
                part,
                first_row: r == 0,
                last_row: r + 1 == rows.len(),
                row_number: r as isize + 1,
                ..Hint::default()
            };
            self.row_lines(out, row, hint);
            if self.table.separators.contains(&r) && r + 1 != rows.len() {
                hint.first_row = false;
                self.separator_line(out, hint);
            }
        }
    }

    fn row_lines(&self, out: &mut String, row: &[String], hint: Hint) {
        if row.is_empty() {
            return;
        }
        let wrapped: Vec<Vec<String>> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                let text = match self.max_width(c) {
                    0 => cell.clone(),
                    max => wrap(cell, max),
                };
                text.split('\n').map(str::to_owned).collect()
            })
            .collect();
        let lines = wrapped.iter().map(Vec::len).max().unwrap_or(1);
        for l in 0..lines {
            let line: Vec<String> = wrapped
                .iter()
                .map(|cell| cell.get(l).cloned().unwrap_or_default())
                .collect();
            self.line(out, &line, hint);
        }
    }

    fn separator_line(&self, out: &mut String, mut hint: Hint) {
        hint.separator = true;
        let line: Vec<String> = self
            .lengths
            .iter()
            .map(|len| self.box_.middle_horizontal.repeat(len + 2))
            .collect();
        self.line(out, &line, hint);
    }

    fn line(&self, out: &mut String, cells: &[String], hint: Hint) {
        if !out.is_empty() {
            out.push('\n');
        }
        let b = self.box_;
        out.push_str(
            match (hint.border_top, hint.border_bottom, hint.separator) {
                (true, _, _) => b.top_left,
                (_, true, _) => b.bottom_left,
                (_, _, true) => b.left_separator,
                _ => b.left,
            },
        );
        let mut c = 0;
        while c < self.columns {
            c = self.cell(out, cells, c, hint);
        }
        out.push_str(
            match (hint.border_top, hint.border_bottom, hint.separator) {
                (true, _, _) => b.top_right,
                (_, true, _) => b.bottom_right,
                (_, _, true) => b.right_separator,
                _ => b.right,
            },
        );
    }

    /// Draws column `c` (and those it merges with); the next column to draw.
    fn cell(&self, out: &mut String, cells: &[String], c: usize, hint: Hint) -> usize {
        if c > 0 {
            out.push_str(self.column_separator(c, hint));
        }
        let mut text = cells.get(c).cloned().unwrap_or_default();
        if hint.part == Part::Header && !hint.separator {
            text = upper(&text);
        }
        let mut align = self.align(c, hint.part);
        let mut len = self.lengths[c];
        let mut drawn = 1;
        if self.hint_merges(hint.part, hint.row_number) && !hint.separator {
            let whole = self.row(hint.part, hint.row_number - 1);
            for next in c + 1..whole.len() {
                if whole[c] != whole[next] {
                    break;
                }
                align = Align::Center;
                len += self.lengths[next] + 3;
                drawn += 1;
            }
        }
        let text = align.apply(&text, len);
        match hint.separator {
            true => out.push_str(&text),
            false => {
                out.push(' ');
                out.push_str(&text);
                out.push(' ');
            }
        }
        c + drawn
    }

    fn column_separator(&self, c: usize, hint: Hint) -> &'static str {
        let b = self.box_;
        if !hint.separator {
            return b.middle_vertical;
        }
        if hint.border_top {
            return match self.merged_below(c, hint) {
                true => b.middle_horizontal,
                false => b.top_separator,
            };
        }
        if hint.border_bottom {
            return match self.merged_above(c, hint) {
                true => b.middle_horizontal,
                false => b.bottom_separator,
            };
        }
        match (self.merged_above(c, hint), self.merged_below(c, hint)) {
            (true, true) => b.middle_horizontal,
            (true, false) => b.top_separator,
            (false, true) => b.bottom_separator,
            (false, false) => b.middle_separator,
        }
    }

    /// Whether the row above this separator draws columns `c - 1` and `c` as one.
    fn merged_above(&self, c: usize, hint: Hint) -> bool {
        let mut merges = self.hint_merges(hint.part, hint.row_number);
        let row = match hint.part {
            Part::Header if hint.row_number == 1 => self.row(Part::Header, 0),
            Part::Footer if hint.first_row => {
                merges = self.hint_merges(Part::Rows, self.rows.len() as isize);
                self.row(Part::Rows, self.rows.len() as isize - 1)
            }
            Part::Footer if hint.border_bottom => {
                self.row(Part::Footer, self.footer.len() as isize - 1)
            }
            part => self.row(part, hint.row_number - 1),
        };
        merges && equal_neighbours(row, c)
    }

    /// Whether the row below this separator draws columns `c - 1` and `c` as one.
    fn merged_below(&self, c: usize, hint: Hint) -> bool {
        let (merges, row) = match hint.part {
            Part::Rows => (
                self.hint_merges(Part::Rows, hint.row_number + 1),
                self.row(Part::Rows, hint.row_number),
            ),
            Part::Header if hint.row_number == 0 => {
                (self.hint_merges(Part::Header, 1), self.row(Part::Header, 0))
            }
            Part::Header if hint.last_row => {
                (self.hint_merges(Part::Rows, 1), self.row(Part::Rows, 0))
            }
            Part::Header => (
                self.hint_merges(Part::Header, hint.row_number + 1),
                self.row(Part::Header, hint.row_number),
            ),
            Part::Footer => (
                self.hint_merges(Part::Footer, 1),
                self.row(Part::Footer, hint.row_number),
            ),
        };
        merges && equal_neighbours(row, c)
    }
}

/// The most cells any row has.
fn widest(header: &[Vec<String>], rows: &[Vec<String>], footer: &[Vec<String>]) -> usize {
    header
        .iter()
        .chain(rows)
        .chain(footer)
        .map(Vec::len)
        .max()
        .unwrap_or(0)
}

fn equal_neighbours(row: &[String], c: usize) -> bool {
    c >= 1 && c < row.len() && row[c - 1] == row[c]
}

/// Whether no data row has printable text in column `c` (go-pretty decides on the first row
/// with any text there).
fn empty_column(rows: &[Vec<String>], c: usize) -> bool {
    for row in rows {
        if let Some(cell) = row.get(c).filter(|cell| !cell.is_empty()) {
            return !cell.chars().any(|ch| !ch.is_control());
        }
    }
    true
}

/// The runs of equal cells of a merging row: first column to last.
fn merged_spans(row: &[String], columns: usize) -> BTreeMap<usize, usize> {
    let mut spans = BTreeMap::new();
    let mut c = 0;
    while c + 1 < columns {
        let mut other = c + 1;
        while other < row.len() {
            if row[c] != row[other] {
                let last = other - 1;
                if c != last {
                    spans.insert(c, last);
                    c = last;
                }
                break;
            } else if other == row.len() - 1 {
                spans.insert(c, other);
                c = other;
            }
            other += 1;
        }
        c += 1;
    }
    spans
}
