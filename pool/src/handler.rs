//! What a worker runs: the [`Handler`] trait, the [`Job`] it receives, and
//! [`TaskHandler`], an adapter that runs each job as a tokio task.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use dashmap::DashMap;
use futures::FutureExt;

use crate::error::AT_CAPACITY_PREFIX;
use crate::lifecycle::JobOutcome;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The error a handler returns. Its text reaches the dispatcher.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A job handed to a worker.
///
/// ```
/// use flotilla_pool::Job;
///
/// fn describe(job: &Job) -> String {
///     // The payload is what `dispatch_job` was given; the token grows with
///     // every start of this key anywhere in the pool.
///     format!("{} ({} bytes, token {})", job.key, job.payload.len(), job.fencing_token)
/// }
/// # let _ = describe;
/// ```
#[derive(Clone)]
pub struct Job {
    /// The job's key, unique in the pool.
    pub key: String,
    /// The opaque payload given to `dispatch_job`.
    pub payload: Bytes,
    /// When the job was first dispatched (Redis server time).
    pub created_at: SystemTime,
    /// Fencing token: strictly increases each time this key starts anywhere
    /// in the pool. Pass it to downstream storage so that it can refuse
    /// writes from a stale owner.
    pub fencing_token: u64,
    /// Reports how the run ended on its own (see [`Job::outcome`]).
    outcome: JobOutcome,
}

impl Job {
    /// A job outside any pool, e.g. to test a handler: its
    /// [`outcome`](Job::outcome) reports go nowhere.
    pub fn new(key: impl Into<String>, payload: Bytes, fencing_token: u64) -> Job {
        let key = key.into();
        Job {
            outcome: JobOutcome::detached(&key, fencing_token),
            key,
            payload,
            created_at: SystemTime::now(),
            fencing_token,
        }
    }

    /// A run handed out by a worker.
    pub(crate) fn new_run(
        key: &str,
        payload: Bytes,
        created_at: SystemTime,
        fencing_token: u64,
        outcome: JobOutcome,
    ) -> Job {
        Job {
            key: key.to_string(),
            payload,
            created_at,
            fencing_token,
            outcome,
        }
    }

    /// The handle that reports how this run ended on its own: finished (the
    /// job leaves the pool) or failed (restarted after a backoff, see
    /// [`RestartPolicy`](crate::RestartPolicy)). A [`TaskHandler`] reports
    /// for its tasks; a [`Handler`] that runs jobs its own way calls it
    /// when a job ends without being stopped.
    pub fn outcome(&self) -> JobOutcome {
        self.outcome.clone()
    }
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("key", &self.key)
            .field("payload_len", &self.payload.len())
            .field("created_at", &self.created_at)
            .field("fencing_token", &self.fencing_token)
            .finish()
    }
}

/// Runs the jobs a worker owns.
///
/// `start` should return once the job is running (spawn long work), and
/// `stop` once it has stopped: the pool hands a job to another worker only
/// after `stop` returned, which is what keeps a key on one worker at a time.
/// Errors and panics are caught and reported; they never kill the worker.
///
/// ```no_run
/// use flotilla_pool::{async_trait, Handler, HandlerError, Job};
/// use std::collections::HashMap;
/// use std::sync::Mutex;
/// use tokio::task::JoinHandle;
///
/// /// One connection task per job key.
/// #[derive(Default)]
/// struct Connections(Mutex<HashMap<String, JoinHandle<()>>>);
///
/// #[async_trait]
/// impl Handler for Connections {
///     async fn start(&self, job: Job) -> Result<(), HandlerError> {
///         let key = job.key.clone();
///         let task = tokio::spawn(async move {
///             // Pass job.fencing_token to the storage you write to.
///             let _ = (job.key, job.fencing_token);
///         });
///         self.0.lock().unwrap().insert(key, task);
///         Ok(())
///     }
///
///     async fn stop(&self, key: &str) -> Result<(), HandlerError> {
///         if let Some(task) = self.0.lock().unwrap().remove(key) {
///             task.abort();
///         }
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Starts a job. An error is returned to the dispatcher as
    /// [`Error::StartFailed`](crate::Error::StartFailed) and the job is not
    /// recorded.
    ///
    /// The job counts as running from the moment `start` is called, and
    /// `start` may take a while (connect somewhere, load state). If the
    /// worker's lease lapses meanwhile, or Redis refuses the start, the
    /// start is cancelled — its future is dropped, so it goes no further —
    /// and [`stop`](Self::stop) is called for the key, within the same
    /// stop budget as the jobs that run, to undo what `start` did so far.
    /// The job starts again later, here or elsewhere.
    async fn start(&self, job: Job) -> Result<(), HandlerError>;

    /// Stops a job this worker runs (asked by `stop_job`, a rebalance, a
    /// lease loss, `close` or `shutdown`).
    ///
    /// Must return within the node's
    /// [`stop_timeout`](crate::NodeOptions::stop_timeout), with the job no
    /// longer acting. The pool waits that long at most: a `stop` still
    /// running then is reported (an error log and the
    /// `flotilla_pool_stop_overruns_total` counter), its future is dropped,
    /// and the job counts as stopped — after a lease loss another worker may
    /// start the key from then on, so work that goes on past the budget is
    /// only kept apart by the fencing token.
    async fn stop(&self, key: &str) -> Result<(), HandlerError>;

    /// The longest this handler's own `stop` may wait for a job, when it
    /// bounds it itself (e.g. [`TaskHandler::stop_timeout`]).
    /// [`Worker::new`](crate::Worker::new) refuses a handler whose budget
    /// exceeds the node's [`stop_timeout`](crate::NodeOptions::stop_timeout).
    /// Default: `None` (no bound of its own).
    fn stop_budget(&self) -> Option<Duration> {
        None
    }

    /// A message for the job `key` sent with `notify_worker`.
    async fn notify(&self, key: &str, payload: Bytes) -> Result<(), HandlerError> {
        let _ = (key, payload);
        Ok(())
    }

    /// A keyed message sent with `dispatch_message`, routed like a job key
    /// but with no job.
    async fn message(&self, key: &str, payload: Bytes) -> Result<(), HandlerError> {
        let _ = (key, payload);
        Ok(())
    }
}

/// A handler's refusal to start a job because the worker already runs as
/// many jobs as it may. Return it (boxed) from [`Handler::start`]: the
/// dispatcher's `dispatch_job` then fails with
/// [`Error::WorkerAtCapacity`](crate::Error::WorkerAtCapacity) rather than
/// [`Error::StartFailed`](crate::Error::StartFailed). The multi-home worker
/// returns it when a home's share of capacity is used up.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AtCapacity {
    /// Jobs running when the start was refused.
    pub running: usize,
    /// The limit that applied.
    pub limit: usize,
}

impl AtCapacity {
    /// A refusal with `running` jobs of `limit` allowed.
    pub fn new(running: usize, limit: usize) -> Self {
        AtCapacity { running, limit }
    }
}

impl fmt::Display for AtCapacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{AT_CAPACITY_PREFIX}{} of {} jobs running",
            self.running, self.limit
        )
    }
}

impl std::error::Error for AtCapacity {}

/// Runs a handler future, turning a panic into an error.
pub(crate) async fn guarded<F>(what: &'static str, fut: F) -> Result<(), String>
where
    F: Future<Output = Result<(), HandlerError>>,
{
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            tracing::error!(what, panic = %msg, "handler panicked");
            Err(format!("handler panicked: {msg}"))
        }
    }
}

/// Runs a handler's `stop` for at most `budget`. An overrun is reported
/// (error log, `flotilla_pool_stop_overruns_total`) and returned as an
/// error; the future is dropped, so the job counts as stopped.
pub(crate) async fn stop_within<F>(
    budget: Duration,
    key: &str,
    overruns: &metrics::Counter,
    fut: F,
) -> Result<(), String>
where
    F: Future<Output = Result<(), HandlerError>>,
{
    match tokio::time::timeout(budget, guarded("stop", fut)).await {
        Ok(result) => result,
        Err(_) => {
            tracing::error!(
                key,
                budget_ms = budget.as_millis() as u64,
                "handler stop overran its budget; the job counts as stopped"
            );
            overruns.increment(1);
            Err(format!("stop overran its budget of {budget:?}"))
        }
    }
}

/// Aborts a job task when dropped: a `stop` cut short by the pool's budget
/// still ends the task (at its next `.await`).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A [`Handler`] that runs each job as a tokio task given a
/// [`CancellationToken`]: write one async fn, the adapter does start/stop.
///
/// A task that returns `Ok(())` on its own finishes its job (the key leaves
/// the pool); one that returns `Err` or panics fails it (restarted after a
/// backoff, see [`RestartPolicy`](crate::RestartPolicy)); a task that ends
/// because its token was cancelled was stopped, and reports nothing.
///
/// `stop` cancels the token and waits for the task to end, up to its stop
/// timeout (by default the node's
/// [`stop_timeout`](crate::NodeOptions::stop_timeout)), then aborts it. An
/// aborted task ends at its next `.await`: a task that blocks a thread
/// without awaiting cannot be stopped in time.
///
/// ```
/// use flotilla_pool::{Job, TaskHandler};
/// use tokio_util::sync::CancellationToken;
///
/// let handler = TaskHandler::new(|job: Job, cancel: CancellationToken| async move {
///     while !cancel.is_cancelled() {
///         // work on job.key ...
///         tokio::select! {
///             _ = cancel.cancelled() => {}
///             _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
///         }
///     }
///     Ok(())
/// });
/// # let _ = handler;
/// ```
pub struct TaskHandler<F> {
    run: Arc<F>,
    tasks: Arc<DashMap<String, (CancellationToken, JoinHandle<()>)>>,
    stop_timeout: Option<Duration>,
}

impl<F> fmt::Debug for TaskHandler<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskHandler")
            .field("running", &self.tasks.len())
            .field("stop_timeout", &self.stop_timeout)
            .finish()
    }
}

impl<F, Fut> TaskHandler<F>
where
    F: Fn(Job, CancellationToken) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    /// Wraps an async fn run once per job.
    pub fn new(run: F) -> Self {
        TaskHandler {
            run: Arc::new(run),
            tasks: Arc::new(DashMap::new()),
            stop_timeout: None,
        }
    }

    /// How long `stop` waits for a cancelled task before aborting it.
    /// Default: the node's [`stop_timeout`](crate::NodeOptions::stop_timeout)
    /// (the pool cuts `stop` short there and the task is aborted). A longer
    /// timeout than the node's is refused by
    /// [`Worker::new`](crate::Worker::new).
    pub fn stop_timeout(mut self, timeout: Duration) -> Self {
        self.stop_timeout = Some(timeout);
        self
    }

    /// Keys of the jobs whose task runs now.
    pub fn running(&self) -> Vec<String> {
        self.tasks.iter().map(|e| e.key().clone()).collect()
    }
}

#[async_trait]
impl<F, Fut> Handler for TaskHandler<F>
where
    F: Fn(Job, CancellationToken) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        let key = job.key.clone();
        let cancel = CancellationToken::new();
        let outcome = job.outcome();
        let fut = (self.run)(job, cancel.clone());
        let task_key = key.clone();
        let stopped = cancel.clone();
        let handle = tokio::spawn(async move {
            let result = guarded("task", fut).await;
            if stopped.is_cancelled() {
                // Ended by `stop`: the stop ends the run.
                if let Err(e) = result {
                    tracing::debug!(key = %task_key, error = %e, "stopped job task ended with an error");
                }
                return;
            }
            match result {
                Ok(()) => outcome.finished(),
                Err(e) => {
                    tracing::warn!(key = %task_key, error = %e, "job task failed");
                    outcome.failed(e);
                }
            }
        });
        if let Some((old_cancel, old)) = self.tasks.insert(key, (cancel, handle)) {
            old_cancel.cancel();
            old.abort();
        }
        Ok(())
    }

    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        let Some((_, (cancel, mut handle))) = self.tasks.remove(key) else {
            return Ok(());
        };
        cancel.cancel();
        // Dropped with this future: the pool's stop budget aborts the task.
        let _abort = AbortOnDrop(handle.abort_handle());
        match self.stop_timeout {
            Some(timeout) => {
                if tokio::time::timeout(timeout, &mut handle).await.is_err() {
                    tracing::warn!(key, "job task did not stop in time; aborting it");
                    handle.abort();
                }
            }
            None => {
                let _ = (&mut handle).await;
            }
        }
        Ok(())
    }

    fn stop_budget(&self) -> Option<Duration> {
        self.stop_timeout
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    struct SlowStop;

    #[async_trait]
    impl Handler for SlowStop {
        async fn start(&self, _job: Job) -> Result<(), HandlerError> {
            Ok(())
        }
        async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        }
    }

    fn job(key: &str) -> Job {
        Job::new(key, Bytes::new(), 1)
    }

    #[tokio::test]
    async fn an_overrunning_stop_is_cut_short_and_reported() {
        let started = tokio::time::Instant::now();
        let result = stop_within(
            Duration::from_millis(100),
            "k",
            &metrics::Counter::noop(),
            SlowStop.stop("k"),
        )
        .await;
        assert!(result.unwrap_err().contains("overran"));
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(100), "{took:?}");
        // A generous bound: the point is that it did not wait for the hour.
        assert!(took < Duration::from_secs(60), "{took:?}");
    }

    #[tokio::test]
    async fn a_task_that_ignores_cancel_is_aborted_when_the_budget_runs_out() {
        let ended = Arc::new(AtomicBool::new(false));
        let flag = ended.clone();
        let handler = TaskHandler::new(move |_job: Job, _cancel: CancellationToken| {
            let flag = flag.clone();
            async move {
                // Ignores its cancellation token; dropped only by an abort.
                struct SetOnDrop(Arc<AtomicBool>);
                impl Drop for SetOnDrop {
                    fn drop(&mut self) {
                        self.0.store(true, Ordering::SeqCst);
                    }
                }
                let _guard = SetOnDrop(flag);
                std::future::pending::<()>().await;
                Ok(())
            }
        });
        assert_eq!(handler.stop_budget(), None);
        handler.start(job("k")).await.unwrap();
        let result = stop_within(
            Duration::from_millis(50),
            "k",
            &metrics::Counter::noop(),
            handler.stop("k"),
        )
        .await;
        assert!(result.is_err());
        // The abort takes effect at the task's next poll.
        tokio::time::timeout(Duration::from_secs(5), async {
            while !ended.load(Ordering::SeqCst) {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the task was not aborted");
        assert!(handler.running().is_empty());
        let bounded = TaskHandler::new(|_job: Job, _cancel: CancellationToken| async { Ok(()) })
            .stop_timeout(Duration::from_secs(2));
        assert_eq!(bounded.stop_budget(), Some(Duration::from_secs(2)));
    }
}
