//! Dispatches with an idempotency window in a chaos run (`--window-ms`).
//!
//! A third of the keys, picked by hash across every lifecycle class, are
//! dispatched with [`DispatchOptions::idempotency_window`]; the others as
//! before. The pool promises that a key admitted by a windowed dispatch is
//! not admitted again by one less than a window later (on Redis server
//! time), even after its run finished or was stopped: the answer is
//! `AlreadyDispatched` ([`crate::ledger::Record::Recent`]). The checker
//! holds it to that wherever Redis kept its data and its clock
//! (`checker::windows`).

use std::time::Duration;

use flotilla_pool::DispatchOptions;

use crate::lifecycle::{final_failure_policy, key_hash};

/// Whether `key` is dispatched with the run's window, when it has one.
pub fn windowed(key: &str) -> bool {
    (key_hash(key) / 16).is_multiple_of(3)
}

/// The options of one dispatch: the final-failure policy
/// ([`final_failure_policy`]) when `fail_for_good`, an idempotency window
/// of `window_ms` unless it is 0.
pub fn dispatch_options(fail_for_good: bool, window_ms: u64) -> DispatchOptions {
    let mut options = DispatchOptions::default();
    if fail_for_good {
        options = options.restart_policy(final_failure_policy());
    }
    if window_ms > 0 {
        options = options.idempotency_window(Duration::from_millis(window_ms));
    }
    options
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_third_of_the_keys_are_windowed_in_every_class() {
        let keys: Vec<String> = (0..3000).map(|i| format!("job-{i:04}")).collect();
        let windowed_count = keys.iter().filter(|k| windowed(k)).count();
        assert!(
            (800..1200).contains(&windowed_count),
            "{windowed_count} of 3000 windowed"
        );
        for class in [
            crate::lifecycle::KeyClass::LongLived,
            crate::lifecycle::KeyClass::Flaky,
            crate::lifecycle::KeyClass::Finite,
        ] {
            let of_class = keys
                .iter()
                .filter(|k| crate::lifecycle::class_of(k) == class && windowed(k))
                .count();
            assert!(of_class > 20, "{of_class} windowed keys of {class:?}");
        }
        assert!(dispatch_options(false, 0).idempotency_window.is_none());
        assert_eq!(
            dispatch_options(true, 1500).idempotency_window,
            Some(Duration::from_millis(1500))
        );
    }
}
