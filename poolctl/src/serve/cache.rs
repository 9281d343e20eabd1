//! The dashboard's reading of the pool: one read shared by every request,
//! refreshed in the background while it is in use.
//!
//! A reading is `PoolSnapshot::read` (every map with `HGETALL`) plus the
//! pool's locks and streams (`SCAN`). With 100,000 jobs that takes a good
//! fraction of a second, so no request waits for it once a first reading
//! exists: a request older than the refresh period gets the current reading
//! at once and starts one refresh in the background (stale while
//! revalidate). The period adapts to the pool: at least
//! [`MIN_REFRESH`], and at least [`COST_FACTOR`] × the last read's
//! duration, so the dashboard never keeps Redis busy more than about a
//! tenth of the time, however large the pool. Nothing is read while nobody
//! looks.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_pool::inspect::{self, LockRecord, PoolSnapshot, StreamDetail};
use fred::prelude::Client;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Shortest time between two readings.
const MIN_REFRESH: Duration = Duration::from_secs(1);
/// A reading is refreshed after this many times its own duration.
const COST_FACTOR: u32 = 10;
/// A reading older than this is not served while a refresh runs: the
/// request waits for the fresh one.
const MAX_STALE: Duration = Duration::from_secs(30);
/// After a failed reading, requests get the error for this long before
/// one tries again (a down Redis is not hammered by every request).
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// Most time one reading may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// One reading of the pool.
#[derive(Debug)]
pub(crate) struct Reading {
    pub(crate) snapshot: PoolSnapshot,
    pub(crate) locks: Vec<LockRecord>,
    pub(crate) streams: Vec<StreamDetail>,
    /// Running and pending jobs, sorted by key (the jobs list pages it).
    pub(crate) rows: Vec<JobRow>,
    /// When it was read (this process's clock).
    pub(crate) read_at: Instant,
    /// How long the read took.
    pub(crate) took: Duration,
}

/// A running or pending job, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobRow {
    pub(crate) key: String,
    pub(crate) state: JobState,
    /// The owner of a running job.
    pub(crate) owner: Option<String>,
    /// Fencing token (of the start, or issued at admission).
    pub(crate) token: u64,
}

/// States a listed job can be in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobState {
    Running,
    Pending,
}

impl JobState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Pending => "pending",
        }
    }
}

/// What a request gets: the newest reading, and the error of the last
/// attempt when it failed (then the reading, if any, is older).
#[derive(Debug, Clone)]
pub(crate) struct Current {
    pub(crate) reading: Option<Arc<Reading>>,
    pub(crate) error: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    reading: Option<Arc<Reading>>,
    /// The last failure and when it happened; cleared by a success.
    error: Option<(String, Instant)>,
}

/// The shared reading and its refresh.
#[derive(Debug)]
pub(crate) struct SnapshotCache {
    client: Client,
    pool: String,
    state: Mutex<State>,
    /// Held by the one refresh under way.
    refreshing: tokio::sync::Mutex<()>,
    tasks: TaskTracker,
    cancel: CancellationToken,
}

impl Reading {
    fn new(
        snapshot: PoolSnapshot,
        locks: Vec<LockRecord>,
        streams: Vec<StreamDetail>,
        took: Duration,
    ) -> Reading {
        let mut rows: Vec<JobRow> = snapshot
            .jobs
            .iter()
            .map(|j| JobRow {
                key: j.key.clone(),
                state: JobState::Running,
                owner: Some(j.owner.clone()),
                token: j.token,
            })
            .chain(snapshot.pending.iter().map(|p| JobRow {
                key: p.key.clone(),
                state: JobState::Pending,
                owner: None,
                token: p.token,
            }))
            .collect();
        rows.sort_by(|a, b| a.key.cmp(&b.key).then(a.token.cmp(&b.token)));
        Reading {
            snapshot,
            locks,
            streams,
            rows,
            read_at: Instant::now(),
            took,
        }
    }

    /// Age of the reading.
    pub(crate) fn age(&self) -> Duration {
        self.read_at.elapsed()
    }

    /// When it should be read again.
    fn refresh_period(&self) -> Duration {
        MIN_REFRESH.max(self.took * COST_FACTOR)
    }
}

impl SnapshotCache {
    pub(crate) fn new(client: Client, pool: String) -> SnapshotCache {
        SnapshotCache {
            client,
            pool,
            state: Mutex::new(State::default()),
            refreshing: tokio::sync::Mutex::new(()),
            tasks: TaskTracker::new(),
            cancel: CancellationToken::new(),
        }
    }

    /// The current reading, refreshed as the module doc says.
    pub(crate) async fn current(self: &Arc<Self>) -> Current {
        let (reading, error) = self.peek();
        if let Some((e, at)) = &error
            && at.elapsed() < RETRY_AFTER
        {
            return Current {
                reading,
                error: Some(e.clone()),
            };
        }
        match &reading {
            Some(r) if error.is_none() && r.age() < r.refresh_period() => Current {
                reading,
                error: None,
            },
            Some(r) if error.is_none() && r.age() < MAX_STALE => {
                self.refresh_in_background();
                Current {
                    reading,
                    error: None,
                }
            }
            _ => {
                self.refresh_now().await;
                let (reading, error) = self.peek();
                Current {
                    reading,
                    error: error.map(|(e, _)| e),
                }
            }
        }
    }

    /// Ends the background refresh (if one runs) and waits for it.
    pub(crate) async fn close(&self) {
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }

    fn peek(&self) -> (Option<Arc<Reading>>, Option<(String, Instant)>) {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (state.reading.clone(), state.error.clone())
    }

    fn refresh_in_background(self: &Arc<Self>) {
        if self.tasks.is_closed() {
            return;
        }
        let me = self.clone();
        self.tasks.spawn(async move {
            // Another refresh under way does the job.
            let Ok(_guard) = me.refreshing.try_lock() else {
                return;
            };
            tokio::select! {
                _ = me.cancel.cancelled() => {}
                () = me.read_and_store() => {}
            }
        });
    }

    async fn refresh_now(&self) {
        let asked = Instant::now();
        let _guard = self.refreshing.lock().await;
        // Someone else refreshed while this one waited: use theirs.
        {
            let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let newer_reading = state.reading.as_ref().is_some_and(|r| r.read_at >= asked);
            let newer_error = state.error.as_ref().is_some_and(|(_, at)| *at >= asked);
            if newer_reading || newer_error {
                return;
            }
        }
        self.read_and_store().await;
    }

    async fn read_and_store(&self) {
        let started = Instant::now();
        let result = tokio::time::timeout(READ_TIMEOUT, read(&self.client, &self.pool)).await;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(Ok((snapshot, locks, streams))) => {
                let took = started.elapsed();
                tracing::debug!(pool = %self.pool, ?took, jobs = snapshot.jobs.len(), "pool read");
                state.reading = Some(Arc::new(Reading::new(snapshot, locks, streams, took)));
                state.error = None;
            }
            Ok(Err(e)) => {
                tracing::warn!(pool = %self.pool, error = %e, "reading the pool failed");
                state.error = Some((e.to_string(), Instant::now()));
            }
            Err(_) => {
                tracing::warn!(pool = %self.pool, "reading the pool timed out");
                state.error = Some((
                    format!("no answer from Redis within {READ_TIMEOUT:?}"),
                    Instant::now(),
                ));
            }
        }
    }
}

async fn read(
    client: &Client,
    pool: &str,
) -> flotilla_pool::Result<(PoolSnapshot, Vec<LockRecord>, Vec<StreamDetail>)> {
    tokio::try_join!(
        PoolSnapshot::read(client, pool),
        inspect::locks(client, Some(pool)),
        inspect::streams(client, pool),
    )
}
