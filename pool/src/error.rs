//! The pool crate's error type.

use std::time::Duration;

/// Text that starts the message of a start refused for capacity; the
/// dispatcher turns such a refusal into
/// [`Error::WorkerAtCapacity`].
pub(crate) const AT_CAPACITY_PREFIX: &str = "worker at capacity: ";

/// Errors of the worker pool, locks, leader leases and the scheduler.
///
/// Every variant is something a caller can act on; causes are kept as
/// sources, never flattened into strings.
///
/// ```no_run
/// # async fn run(node: flotilla_pool::Node) {
/// use flotilla_pool::Error;
///
/// match node.dispatch_job("customer-42", &b"{}"[..]).await {
///     Ok(()) => println!("started"),
///     Err(Error::JobExists(key)) => println!("{key} already runs"),
///     Err(Error::Timeout(_) | Error::Unavailable(_)) => println!("may or may not run: retry"),
///     Err(Error::WritesRefused(_)) => println!("not admitted: Redis refuses writes for now"),
///     Err(e) => eprintln!("refused: {e}"),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The job key is already running or being dispatched.
    #[error("job {0:?} already exists (running or being dispatched)")]
    JobExists(String),
    /// The key was admitted within the idempotency window asked for with
    /// [`DispatchOptions::idempotency_window`](crate::DispatchOptions::idempotency_window):
    /// it is not started again, even if it has finished since.
    #[error(
        "job {key:?} was already dispatched within the idempotency window (retry after {retry_after:?})"
    )]
    AlreadyDispatched {
        /// The job key.
        key: String,
        /// How long until the window of the earlier admission ends
        /// (Redis server time).
        retry_after: Duration,
    },
    /// A schedule's dispatch was refused because this node no longer holds
    /// the schedule's leader lease (checked atomically with admission).
    #[error("schedule {0:?} is led by another node now")]
    NotLeader(String),
    /// No job with this key runs in the pool.
    #[error("job {0:?} not found")]
    JobNotFound(String),
    /// No worker with this id is registered in the pool (never was, or it
    /// left or was removed).
    #[error("no worker {0:?} in the pool")]
    UnknownWorker(String),
    /// [`Node::remove_dead_worker`](crate::Node::remove_dead_worker) was
    /// refused: Redis holds a keep-alive of the worker within the worker
    /// TTL (by Redis server time), so it is alive and keeps its jobs.
    #[error("worker {worker:?} is alive: last keep-alive {silent:?} ago, within the worker TTL")]
    WorkerAlive {
        /// The worker.
        worker: String,
        /// Time since its last keep-alive (Redis server time).
        silent: Duration,
    },
    /// No worker is active in the pool, and none joined before the timeout.
    #[error("no active worker in pool {0:?}")]
    NoActiveWorker(String),
    /// The owner's inbox holds `max_queued_jobs` events already.
    #[error("pool is full: the owner's inbox holds {0} queued events")]
    PoolFull(u64),
    /// The node, worker or lock was closed.
    #[error("closed")]
    Closed,
    /// The pool is shutting down; no node may join and no job may start.
    #[error("pool {0:?} is shutting down")]
    ShuttingDown(String),
    /// An operation did not complete within its deadline.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The handler's `start` failed; the message is the handler's error.
    #[error("the handler failed to start job {key:?}: {message}")]
    StartFailed {
        /// The job key.
        key: String,
        /// The handler's error, as text (it crossed process boundaries).
        message: String,
    },
    /// The worker that owns the job refused to start it because it runs
    /// as many jobs as it may (a multi-home worker's share of capacity, or
    /// a handler returning [`AtCapacity`](crate::AtCapacity)). The job was
    /// not recorded; dispatch it again later.
    #[error("the worker refused job {key:?}: {message}")]
    WorkerAtCapacity {
        /// The job key.
        key: String,
        /// The worker's message (running and allowed jobs).
        message: String,
    },
    /// A multi-home configuration is unusable.
    #[error(transparent)]
    HomeConfig(#[from] crate::multihome::config::ConfigError),
    /// A job key, pool, worker or lock name is invalid.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        /// What was named: "job key", "pool name", "lock name", ...
        what: &'static str,
        /// The offending value (truncated to 64 chars).
        value: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A payload is larger than the node's limit.
    #[error("payload of {size} bytes exceeds the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The payload's size.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// Options failed validation.
    #[error("invalid option {option}: {reason}")]
    InvalidOptions {
        /// The option's name.
        option: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// The Redis server is set up in a way that breaks the pool's
    /// guarantees (see the pool README, "Redis settings").
    #[error("redis setting {setting} = {value:?} is unsafe for the pool: {reason}")]
    UnsafeServer {
        /// The server setting (`maxmemory-policy`).
        setting: &'static str,
        /// Its value on the server.
        value: String,
        /// What it would break and how to fix it.
        reason: String,
    },
    /// The lock is held by someone else.
    #[error("lock {name:?} is held by {holder}")]
    LockHeld {
        /// The lock's name.
        name: String,
        /// Who holds it (id, host, pid).
        holder: String,
    },
    /// The caller does not hold the lock (it expired or someone else took it).
    #[error("lock {0:?} is not held by this owner")]
    NotLockOwner(String),
    /// Redis could not be reached within the operation's timeout.
    #[error("redis unavailable: {0}")]
    Unavailable(#[source] fred::error::Error),
    /// A replicated-map operation failed.
    #[error(transparent)]
    Map(#[from] flotilla_rmap::Error),
    /// A stream operation failed.
    #[error(transparent)]
    Stream(#[from] flotilla_streaming::Error),
    /// Redis refuses writes for now, while it keeps its data and answers:
    /// out of memory (`OOM`: `maxmemory` reached under `noeviction`), a
    /// read-only replica (`READONLY`: a failover the client has not
    /// followed yet), a failed background save (`MISCONF`), too few
    /// replicas (`NOREPLICAS`) or a replica cut from its primary
    /// (`MASTERDOWN`). Passing, unlike [`Error::Redis`]: retry once Redis
    /// takes writes again. Redis refuses such a call before it runs it, so
    /// the refused call wrote nothing.
    #[error("redis refuses writes: {0}")]
    WritesRefused(#[source] fred::error::Error),
    /// Redis answered with an error.
    #[error("redis error: {0}")]
    Redis(#[from] fred::error::Error),
    /// A message read from Redis could not be decoded.
    #[error("malformed {what}: {reason}")]
    Malformed {
        /// What was being decoded.
        what: &'static str,
        /// Why it failed.
        reason: String,
    },
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The error of a start the handler refused: [`Error::WorkerAtCapacity`]
/// for a capacity refusal, [`Error::StartFailed`] otherwise.
pub(crate) fn start_refused(key: &str, message: String) -> Error {
    if message.starts_with(AT_CAPACITY_PREFIX) {
        Error::WorkerAtCapacity {
            key: key.to_string(),
            message,
        }
    } else {
        Error::StartFailed {
            key: key.to_string(),
            message,
        }
    }
}

/// The error codes of a Redis that refuses writes for now
/// ([`Error::WritesRefused`]).
const WRITES_REFUSED: [&str; 5] = [
    "OOM ",
    "READONLY ",
    "MISCONF ",
    "NOREPLICAS ",
    "MASTERDOWN ",
];

/// Classifies a fred error: connection trouble (I/O, timeout, cancelled,
/// routing, client backpressure, a server still loading its data) becomes
/// [`Error::Unavailable`], writes refused for now [`Error::WritesRefused`],
/// anything else [`Error::Redis`].
pub(crate) fn from_redis(e: fred::error::Error) -> Error {
    use fred::error::ErrorKind;
    match e.kind() {
        ErrorKind::IO
        | ErrorKind::Timeout
        | ErrorKind::Canceled
        | ErrorKind::Routing
        | ErrorKind::Backpressure => Error::Unavailable(e),
        _ if e.details().starts_with("LOADING") => Error::Unavailable(e),
        _ if WRITES_REFUSED
            .iter()
            .any(|code| e.details().starts_with(code)) =>
        {
            Error::WritesRefused(e)
        }
        _ => Error::Redis(e),
    }
}
