//! The figures a run collects, printed as one table or as JSON
//! (schema in `bench/README.md`).

use std::borrow::Cow;

use serde::Serialize;

/// Version of the JSON document; bumped when a field changes meaning.
pub const SCHEMA: &str = "flotilla-bench/1";

/// One measured figure.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    /// Section that measured it (`dispatch`, `commands`, `failover`, …).
    pub section: &'static str,
    /// Stable machine id within the section.
    pub id: Cow<'static, str>,
    /// Human label.
    pub label: String,
    /// The value; `None` when it could not be measured.
    pub value: Option<f64>,
    /// Unit of `value`.
    pub unit: &'static str,
    /// The DESIGN.md target, when there is one.
    pub target: Option<String>,
    /// Whether the target is met (`None`: no target or not decidable).
    pub met: Option<bool>,
    /// Extra detail (sample counts, breakdowns).
    pub detail: Option<String>,
}

impl Figure {
    /// A figure without target.
    pub fn new(
        section: &'static str,
        id: impl Into<Cow<'static, str>>,
        label: impl Into<String>,
    ) -> Figure {
        Figure {
            section,
            id: id.into(),
            label: label.into(),
            value: None,
            unit: "",
            target: None,
            met: None,
            detail: None,
        }
    }

    /// Sets the value and unit.
    pub fn value(mut self, value: f64, unit: &'static str) -> Figure {
        self.value = Some(value);
        self.unit = unit;
        self
    }

    /// Sets the unit only (the value stays unmeasured).
    pub fn unit(mut self, unit: &'static str) -> Figure {
        self.unit = unit;
        self
    }

    /// Target `value <= limit`.
    pub fn at_most(mut self, limit: f64, text: impl Into<String>) -> Figure {
        self.target = Some(text.into());
        self.met = self.value.map(|v| v <= limit);
        self
    }

    /// Target `value >= limit`.
    pub fn at_least(mut self, limit: f64, text: impl Into<String>) -> Figure {
        self.target = Some(text.into());
        self.met = self.value.map(|v| v >= limit);
        self
    }

    /// A target stated but not decidable in this run.
    pub fn target_text(mut self, text: impl Into<String>) -> Figure {
        self.target = Some(text.into());
        self
    }

    /// Sets the detail.
    pub fn detail(mut self, detail: impl Into<String>) -> Figure {
        self.detail = Some(detail.into());
        self
    }
}

/// The whole run.
#[derive(Debug, Serialize)]
pub struct Report {
    /// [`SCHEMA`].
    pub schema: &'static str,
    /// `redis_version` from `INFO server`.
    pub redis_version: String,
    /// The benchmark program's allocator: `jemalloc` (default build) or
    /// `system` (`--no-default-features`).
    pub allocator: &'static str,
    /// Whether the program started its own Redis (no `REDIS_URL`).
    pub private_redis: bool,
    /// Options the run used.
    pub options: serde_json::Value,
    /// Every figure, in measuring order.
    pub figures: Vec<Figure>,
    /// Sections that failed, with the error.
    pub errors: Vec<SectionError>,
}

/// A section that could not finish.
#[derive(Debug, Serialize)]
pub struct SectionError {
    /// Section name.
    pub section: String,
    /// The error, as text.
    pub error: String,
}

impl Report {
    /// Adds a figure.
    pub fn push(&mut self, figure: Figure) {
        self.figures.push(figure);
    }

    /// The value of `section.id`, if measured.
    pub fn get(&self, section: &str, id: &str) -> Option<f64> {
        self.figures
            .iter()
            .find(|f| f.section == section && f.id == id)
            .and_then(|f| f.value)
    }

    /// Renders the table.
    pub fn table(&self) -> String {
        let header = ["section", "figure", "value", "target", "met", "detail"];
        let rows: Vec<[String; 6]> = self
            .figures
            .iter()
            .map(|f| {
                [
                    f.section.to_string(),
                    f.label.clone(),
                    match f.value {
                        Some(v) => format!("{} {}", format_number(v), f.unit),
                        None => "n/a".to_string(),
                    },
                    f.target.clone().unwrap_or_default(),
                    match f.met {
                        Some(true) => "yes".into(),
                        Some(false) => "NO".into(),
                        None => "-".into(),
                    },
                    f.detail.clone().unwrap_or_default(),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::from("|");
            for (cell, w) in cells.iter().zip(widths) {
                s.push_str(&format!(" {cell:<w$} |"));
            }
            s.push('\n');
            s
        };
        let mut out = line(&header.map(String::from));
        out.push('|');
        for w in widths {
            out.push_str(&"-".repeat(w + 2));
            out.push('|');
        }
        out.push('\n');
        for row in &rows {
            out.push_str(&line(row));
        }
        for e in &self.errors {
            out.push_str(&format!("section {} failed: {}\n", e.section, e.error));
        }
        out
    }
}

/// A number with as many decimals as its size deserves.
pub fn format_number(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 {
        let whole = format!("{:.0}", v);
        group_thousands(&whole)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.1 || a == 0.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn group_thousands(digits: &str) -> String {
    let (sign, digits) = match digits.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", digits),
    };
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    format!("{sign}{out}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(format_number(26_123.4), "26,123");
        assert_eq!(format_number(1_000_000.0), "1,000,000");
        assert_eq!(format_number(512.3), "512");
        assert_eq!(format_number(12.34), "12.3");
        assert_eq!(format_number(0.456), "0.46");
        assert_eq!(format_number(0.0456), "0.046");
    }

    #[test]
    fn targets_decide_met() {
        let f = Figure::new("s", "x", "x")
            .value(0.4, "ms")
            .at_most(0.5, "<= 0.5 ms");
        assert_eq!(f.met, Some(true));
        let f = Figure::new("s", "x", "x")
            .unit("ms")
            .at_most(0.5, "<= 0.5 ms");
        assert_eq!(f.met, None);
        let f = Figure::new("s", "x", "x")
            .value(2.0, "x")
            .at_least(3.0, ">= 3x");
        assert_eq!(f.met, Some(false));
    }
}
