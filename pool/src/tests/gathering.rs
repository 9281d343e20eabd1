//! Handler calls that wait for one another: each waits until `together`
//! of them are under way at once, or `give_up` has passed. A test that
//! needs calls to run side by side makes them gather; run one after the
//! other, each gives up, and the most seen at once tells.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Counts the calls under way and the most seen at once.
#[derive(Clone)]
pub(super) struct Gathering {
    together: usize,
    give_up: Duration,
    under_way: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    gathered: Arc<tokio::sync::Notify>,
}

impl Gathering {
    pub(super) fn new(together: usize, give_up: Duration) -> Gathering {
        Gathering {
            together,
            give_up,
            under_way: Arc::default(),
            most: Arc::default(),
            gathered: Arc::default(),
        }
    }

    /// Waits until `together` calls are under way (this one included), or
    /// `give_up` has passed.
    pub(super) async fn gather(&self) {
        let now = self.under_way.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let gathered = self.gathered.notified();
        if now >= self.together {
            self.gathered.notify_waiters();
        } else {
            let _ = tokio::time::timeout(self.give_up, gathered).await;
        }
        self.under_way.fetch_sub(1, Ordering::SeqCst);
    }

    /// The most calls seen under way at once.
    pub(super) fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}
