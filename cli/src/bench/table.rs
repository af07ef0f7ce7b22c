//! The one way `sous bench` lays out a table for the terminal: each column as wide as
//! its widest cell (counted in characters), two spaces between columns, every column
//! right-aligned but the first when it holds text, an optional indent, and no spaces at
//! the end of a line. The level table, `compare`, `logs` and `scrape` all render their
//! tables here. Not here: what the cells say, or anything around the table.
//!
//! Hand-written rather than with `comfy-table` or `tabled`: both measure cells by
//! display width (`unicode-width`, so a wide character counts twice where the reports
//! have always counted it once), pad cells on both sides and wrap to the terminal's
//! width, so neither gives the reports' output byte for byte, and the layout is one
//! short function.

/// How the first column is aligned; the others are always right-aligned (numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum First {
    /// Right-aligned, like the others (a number such as a concurrency).
    Right,
    /// Left-aligned (a label such as a minute or a latency's name).
    Left,
}

/// Lays out `rows` (the header first, if any), each line starting with `indent`.
pub fn layout(rows: &[Vec<String>], indent: &str, first: First) -> String {
    layout_left(rows, indent, usize::from(first == First::Left))
}

/// [`layout`] with the first `left` columns left-aligned (names, URLs, states) and the
/// rest right-aligned (numbers), as `sous ps` and `sous list` show them.
pub fn layout_left(rows: &[Vec<String>], indent: &str, left: usize) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::from(indent);
        for (c, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if c > 0 {
                line.push_str("  ");
            }
            if c < left {
                line.push_str(&format!("{cell:<width$}"));
            } else {
                line.push_str(&format!("{cell:>width$}"));
            }
        }
        out.push_str(line.trim_end_matches(' '));
        out.push('\n');
    }
    out
}

/// The cells of a header row.
pub fn header(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|c| (*c).to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_fit_their_widest_cell_and_lines_end_without_spaces() {
        let rows = vec![
            header(&["conc", "metric", "B/A"]),
            vec!["1".into(), "out tok/s".into(), "1.00x".into()],
            vec!["16".into(), "ITL p50 ms".into(), String::new()],
        ];
        assert_eq!(
            layout(&rows, "", First::Right),
            "conc      metric    B/A\n   1   out tok/s  1.00x\n  16  ITL p50 ms\n"
        );
        assert_eq!(
            layout(&rows, "  ", First::Left),
            "  conc      metric    B/A\n  1      out tok/s  1.00x\n  16    ITL p50 ms\n"
        );
        // Characters, not bytes or display columns.
        let wide = vec![header(&["é", "x"]), vec!["ab".into(), "1".into()]];
        assert_eq!(layout(&wide, "", First::Left), "é   x\nab  1\n");
        assert_eq!(layout(&[], "", First::Right), "");
    }
}
