//! Formatting helpers for the reports the examples print.

use std::time::Duration;

/// A duration for people: `850 ms`, `2.41 s`.
pub fn human(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{:.0} ms", d.as_secs_f64() * 1000.0)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

/// The `p`-th percentile (0–100) of an ascending slice, or zero when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// The first `n` characters of an id, for narrow columns.
pub fn short(id: &str, n: usize) -> &str {
    match id.char_indices().nth(n) {
        Some((end, _)) => &id[..end],
        None => id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_percentiles() {
        assert_eq!(human(Duration::from_millis(850)), "850 ms");
        assert_eq!(human(Duration::from_millis(2410)), "2.41 s");
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 50.0), Duration::from_millis(51));
        assert_eq!(percentile(&v, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
        assert_eq!(short("w-0123456789", 6), "w-0123");
        assert_eq!(short("w", 6), "w");
    }
}
