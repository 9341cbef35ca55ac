//! Plain-text tables for the human output: a header row, columns padded to
//! their widest cell and separated by two spaces, numbers right-aligned,
//! empty cells shown as `-`, no trailing whitespace.

/// How a column's cells are aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// One column: its header and alignment.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    pub header: &'static str,
    pub align: Align,
}

/// A left-aligned column.
pub const fn left(header: &'static str) -> Column {
    Column {
        header,
        align: Align::Left,
    }
}

/// A right-aligned column (sizes, counts).
pub const fn right(header: &'static str) -> Column {
    Column {
        header,
        align: Align::Right,
    }
}

/// A table being filled row by row.
#[derive(Debug, Clone)]
pub struct Table {
    columns: Vec<Column>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: &[Column]) -> Table {
        Table {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row. Missing cells are empty; extra cells are dropped.
    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut row: Vec<String> = cells
            .into_iter()
            .take(self.columns.len())
            .map(Into::into)
            .collect();
        row.resize(self.columns.len(), String::new());
        self.rows.push(row);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text, one line per row, each ending in `\n`.
    pub fn render(&self) -> String {
        let cell = |s: &str| -> String {
            if s.is_empty() {
                "-".to_string()
            } else {
                // Keep one row on one line whatever the server sent.
                s.replace(['\n', '\r', '\t'], " ")
            }
        };
        let header: Vec<String> = self.columns.iter().map(|c| c.header.to_string()).collect();
        let body: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| r.iter().map(|s| cell(s)).collect())
            .collect();
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for row in &body {
            for (w, s) in widths.iter_mut().zip(row) {
                *w = (*w).max(s.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&header).chain(&body) {
            let mut line = String::new();
            for (i, (s, column)) in row.iter().zip(&self.columns).enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = widths[i] - s.chars().count();
                match column.align {
                    Align::Left => {
                        line.push_str(s);
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                    Align::Right => {
                        line.extend(std::iter::repeat_n(' ', pad));
                        line.push_str(s);
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_aligns_and_fills() {
        let mut t = Table::new(&[left("NAME"), right("SIZE"), left("PATH")]);
        t.row(["a", "10 GiB", "/dev/loop3"]);
        t.row(["longer-name", "512 MiB", ""]);
        t.row(["short"]);
        assert_eq!(
            t.render(),
            "NAME            SIZE  PATH\n\
             a             10 GiB  /dev/loop3\n\
             longer-name  512 MiB  -\n\
             short              -  -\n"
        );
    }

    #[test]
    fn header_only_and_odd_cells() {
        let t = Table::new(&[left("GROUP"), right("FREE")]);
        assert!(t.is_empty());
        assert_eq!(t.render(), "GROUP  FREE\n");
        let mut t = Table::new(&[left("REASON")]);
        t.row(["two\nlines", "dropped"]);
        assert_eq!(t.render(), "REASON\ntwo lines\n");
    }

    #[test]
    fn widths_count_characters_not_bytes() {
        let mut t = Table::new(&[left("N"), left("X")]);
        t.row(["é", "1"]);
        t.row(["ab", "2"]);
        assert_eq!(t.render(), "N   X\né   1\nab  2\n");
    }
}
