//! Failure records (`fl:{pool}:failures`, job key → record), decoded in
//! one place; the scripts that write them are called from
//! `store/lifecycle.rs`.

use std::time::{Duration, SystemTime};

/// State of a failure record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureState {
    /// Run `token` failed; restart due at `at`.
    Restarting,
    /// Restart `token` runs after `failures` failures.
    Running,
    /// Failed for good at `at`.
    Failed,
}

/// A decoded failure record: `"<state> <n> <token> <at_ms> <error>"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailureRecord {
    pub(crate) state: FailureState,
    pub(crate) failures: u32,
    pub(crate) token: u64,
    pub(crate) at: SystemTime,
    pub(crate) last_error: String,
}

impl FailureRecord {
    /// Parses a record; `None` (logged by the caller) if it is malformed.
    pub(crate) fn parse(value: &str) -> Option<FailureRecord> {
        let mut parts = value.splitn(5, ' ');
        let state = match parts.next()? {
            "restarting" => FailureState::Restarting,
            "running" => FailureState::Running,
            "failed" => FailureState::Failed,
            _ => return None,
        };
        let failures = parts.next()?.parse().ok()?;
        let token = parts.next()?.parse().ok()?;
        let at_ms: u64 = parts.next()?.parse().ok()?;
        Some(FailureRecord {
            state,
            failures,
            token,
            at: SystemTime::UNIX_EPOCH + Duration::from_millis(at_ms),
            last_error: parts.next().unwrap_or("").to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_records_round_trip_their_fields() {
        let r =
            FailureRecord::parse("restarting 3 1795368799924451 1795368800000 boom: a b").unwrap();
        assert_eq!(r.state, FailureState::Restarting);
        assert_eq!((r.failures, r.token), (3, 1_795_368_799_924_451));
        assert_eq!(r.last_error, "boom: a b");
        assert_eq!(
            r.at,
            SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_368_800_000)
        );
        assert_eq!(
            FailureRecord::parse("failed 10 5 6 ").unwrap().last_error,
            ""
        );
        for bad in [
            "",
            "weird 1 2 3 x",
            "failed x 2 3 e",
            "failed 1 1.7e15 3 e",
            "running 1 2",
        ] {
            assert!(FailureRecord::parse(bad).is_none(), "{bad}");
        }
    }
}
