//! Topic filters.

use std::fmt;
use std::sync::Arc;

/// A user predicate over an event's topic.
pub type TopicPredicate = Arc<dyn Fn(Option<&str>) -> bool + Send + Sync>;

/// Which events a reader or sink delivers, by topic.
#[derive(Clone, Default)]
pub enum TopicFilter {
    /// Every event. The default.
    #[default]
    All,
    /// Only events whose topic equals this.
    Exact(String),
    /// Only events whose topic matches this glob (`*` any run of
    /// characters, `?` one character). Events without a topic never match.
    Pattern(String),
    /// Only events for which this returns `true` (given the topic, if any).
    Predicate(TopicPredicate),
}

impl TopicFilter {
    /// A predicate filter.
    pub fn predicate(f: impl Fn(Option<&str>) -> bool + Send + Sync + 'static) -> Self {
        TopicFilter::Predicate(Arc::new(f))
    }

    /// Whether an event with this topic passes the filter.
    pub fn matches(&self, topic: Option<&str>) -> bool {
        match self {
            TopicFilter::All => true,
            TopicFilter::Exact(t) => topic == Some(t.as_str()),
            TopicFilter::Pattern(p) => topic.is_some_and(|t| glob_match(p, t)),
            TopicFilter::Predicate(f) => f(topic),
        }
    }
}

impl fmt::Debug for TopicFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopicFilter::All => f.write_str("All"),
            TopicFilter::Exact(t) => f.debug_tuple("Exact").field(t).finish(),
            TopicFilter::Pattern(p) => f.debug_tuple("Pattern").field(p).finish(),
            TopicFilter::Predicate(_) => f.write_str("Predicate(..)"),
        }
    }
}

/// Glob match with `*` and `?` over chars, linear-time backtracking.
fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("a*", "abc"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "ac"));
        assert!(glob_match("orders.*.eu", "orders.new.eu"));
        assert!(!glob_match("orders.*.eu", "orders.new.us"));
        assert!(glob_match("*x*y", "axbxy"));
        assert!(!glob_match("abc", "abcd"));
    }

    #[test]
    fn filters() {
        assert!(TopicFilter::All.matches(None));
        assert!(TopicFilter::Exact("a".into()).matches(Some("a")));
        assert!(!TopicFilter::Exact("a".into()).matches(None));
        assert!(!TopicFilter::Pattern("*".into()).matches(None));
        assert!(TopicFilter::predicate(|t| t.is_none()).matches(None));
    }
}
