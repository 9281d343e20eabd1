//! Human-readable text: durations, sizes, hex dumps and 80-column tables.

use std::fmt::Write as _;

/// `3.2s`, `450ms`, `12m`, `1.5h`, `3.0d`.
pub(crate) fn duration_ms(ms: u64) -> String {
    let s = ms as f64 / 1000.0;
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{s:.1}s"),
        60_000..=3_599_999 => format!("{:.0}m", s / 60.0),
        3_600_000..=86_399_999 => format!("{:.1}h", s / 3600.0),
        _ => format!("{:.1}d", s / 86_400.0),
    }
}

/// `3.2s ago`; `-` when unknown.
pub(crate) fn ago(ms: Option<u64>) -> String {
    ms.map_or_else(|| "-".to_string(), |ms| format!("{} ago", duration_ms(ms)))
}

/// `in 3.2s` or `3.2s overdue`.
pub(crate) fn until(ms: i64) -> String {
    if ms >= 0 {
        format!("in {}", duration_ms(ms as u64))
    } else {
        format!("{} overdue", duration_ms(ms.unsigned_abs()))
    }
}

/// `512B`, `1.5KiB`, `3.0MiB`.
pub(crate) fn bytes(n: usize) -> String {
    match n {
        0..=1023 => format!("{n}B"),
        1024..=1_048_575 => format!("{:.1}KiB", n as f64 / 1024.0),
        _ => format!("{:.1}MiB", n as f64 / 1_048_576.0),
    }
}

/// `s` cut to `width` characters, with `…` when cut.
pub(crate) fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Lowercase hex of `bytes`, 16 bytes a line with offsets.
pub(crate) fn hex_dump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (i, chunk) in bytes.chunks(16).enumerate() {
        let _ = write!(out, "{:08x} ", i * 16);
        for b in chunk {
            let _ = write!(out, " {b:02x}");
        }
        out.push('\n');
    }
    out
}

/// Lowercase hex of `bytes`, no separators.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// A left-aligned text table; each column has a maximum width and cells
/// are cut with `…` to fit.
#[derive(Debug)]
pub(crate) struct Table {
    headers: Vec<(&'static str, usize)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with `(header, max width)` columns.
    pub(crate) fn new(headers: &[(&'static str, usize)]) -> Table {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (missing cells are empty).
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, one line per row, no trailing spaces.
    pub(crate) fn render(&self) -> String {
        let widths: Vec<usize> = self
            .headers
            .iter()
            .enumerate()
            .map(|(i, (h, max))| {
                self.rows
                    .iter()
                    .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                    .chain([h.len()])
                    .max()
                    .unwrap_or(0)
                    .min(*max)
            })
            .collect();
        let mut out = String::new();
        let header: Vec<String> = self.headers.iter().map(|(h, _)| h.to_string()).collect();
        for cells in std::iter::once(&header).chain(self.rows.iter()) {
            let mut line = String::new();
            for (i, w) in widths.iter().enumerate() {
                let cell = fit(cells.get(i).map_or("", String::as_str), *w);
                let _ = write!(line, "{cell:<w$}  ");
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
    fn human_durations() {
        assert_eq!(ago(Some(3_200)), "3.2s ago");
        assert_eq!(ago(Some(450)), "450ms ago");
        assert_eq!(ago(None), "-");
        assert_eq!(duration_ms(720_000), "12m");
        assert_eq!(duration_ms(5_400_000), "1.5h");
        assert_eq!(until(-1500), "1.5s overdue");
        assert_eq!(bytes(1536), "1.5KiB");
    }

    #[test]
    fn tables_fit_their_columns() {
        let mut t = Table::new(&[("ID", 6), ("N", 3)]);
        t.row(vec!["abcdefghij".into(), "1".into()]);
        assert_eq!(t.render(), "ID      N\nabcde…  1\n");
        assert_eq!(fit("abc", 3), "abc");
        assert_eq!(hex(b"\x00\xff"), "00ff");
        assert_eq!(hex_dump(b"ab"), "00000000  61 62\n");
    }
}
