//! Charts as inline SVG: an area under a polyline, scaled to the series'
//! maximum. The page's script recomputes the same `points` from
//! `/api/history` (see `app.js`, `chartPoints`), so both must agree on
//! the geometry: width [`WIDTH`], height [`HEIGHT`], x spread evenly,
//! y = height − value / max × (height − 2).

use maud::{Markup, html};

use super::history::Series;

/// Chart width in SVG units.
pub(crate) const WIDTH: f64 = 720.0;
/// Chart height in SVG units.
pub(crate) const HEIGHT: f64 = 90.0;

/// The polyline points of `values`.
pub(crate) fn points(values: &[f64]) -> String {
    let max = values.iter().copied().fold(0.0_f64, f64::max);
    let n = values.len().max(2) - 1;
    let mut out = String::with_capacity(values.len() * 12);
    for (i, v) in values.iter().enumerate() {
        let x = i as f64 * WIDTH / n as f64;
        let y = if max > 0.0 {
            HEIGHT - v / max * (HEIGHT - 2.0)
        } else {
            HEIGHT
        };
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&format!("{x:.1},{y:.1}"));
    }
    out
}

/// Largest value of a series, for the label.
pub(crate) fn peak(values: &[f64]) -> f64 {
    values.iter().copied().fold(0.0, f64::max)
}

/// One chart with its title and peak.
pub(crate) fn chart(series: &Series) -> Markup {
    let peak = peak(&series.values);
    html! {
        figure.chart data-series=(series.name) {
            figcaption {
                (series.title) " "
                span.peak { "peak " (fmt_value(peak)) }
            }
            svg viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) preserveAspectRatio="none"
                role="img" aria-label=(series.title) {
                polyline.line points=(points(&series.values)) {}
            }
            div.axis { span { "−60 min" } span { "now" } }
        }
    }
}

/// A value for a label: integers without decimals.
pub(crate) fn fmt_value(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_span_the_chart() {
        let p = points(&[0.0, 5.0, 10.0]);
        assert_eq!(p, "0.0,90.0 360.0,46.0 720.0,2.0");
        assert_eq!(points(&[0.0, 0.0]), "0.0,90.0 720.0,90.0");
        assert_eq!(fmt_value(3.0), "3");
        assert_eq!(fmt_value(2.34), "2.3");
    }
}
