//! Dispatches and stops sent through a worker process (`--requests`): the
//! driver writes one request line to the process's stdin, the process calls
//! `dispatch_job` or `stop_job` on its own node — the node whose workers
//! may hold the key, and which the faults cut, pause and kill — and prints
//! one reply line on its stdout.
//!
//! ```text
//! request: <id> dispatch <key> <0|1> <window ms>
//!            (1: with the final-failure policy; window 0: none)
//!          <id> stop <key>
//! reply:   <id> ok <node id> | <id> exists | <id> recent | <id> not_found
//!          | <id> error <kind>
//! ```
//!
//! The driver's ledger records each request as it records its own nodes'
//! (sent before the line is written, the outcome once the reply is read),
//! so the checker judges them alike; a process that dies or stays silent
//! leaves the outcome unknown, as an error does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_pool::Error;
use tokio::io::{AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::oneshot;

/// What a request asks of the worker process's node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `dispatch_job_with` of the key, with
    /// [`crate::windows::dispatch_options`].
    Dispatch {
        /// Job key.
        key: String,
        /// Dispatch with the final-failure policy.
        fail_for_good: bool,
        /// The dispatch's idempotency window in ms (0: none).
        window_ms: u64,
    },
    /// `stop_job` of the key.
    Stop {
        /// Job key.
        key: String,
    },
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// `Ok`: admitted (by the node with this id) or stopped.
    Ok(String),
    /// `JobExists`.
    Exists,
    /// `AlreadyDispatched` (a dispatch with an idempotency window).
    Recent,
    /// `JobNotFound`.
    NotFound,
    /// Any other error, by kind ([`error_kind`]), or no answer: the
    /// process died (`gone`) or stayed silent (`no reply`).
    Failed(String),
}

impl Outcome {
    /// The outcome of a node's call; `node` names the node for `Ok`.
    pub fn of(result: &Result<(), Error>, node: &str) -> Outcome {
        match result {
            Ok(()) => Outcome::Ok(node.to_string()),
            Err(Error::JobExists(_)) => Outcome::Exists,
            Err(Error::AlreadyDispatched { .. }) => Outcome::Recent,
            Err(Error::JobNotFound(_)) => Outcome::NotFound,
            Err(e) => Outcome::Failed(error_kind(e)),
        }
    }
}

/// A short name of an error for the run's counters.
pub fn error_kind(e: &Error) -> String {
    match e {
        Error::Timeout(_) => "timeout".into(),
        Error::Unavailable(_) => "unavailable".into(),
        Error::WritesRefused(_) => "writes refused".into(),
        Error::NoActiveWorker(_) => "no active worker".into(),
        Error::PoolFull(_) => "pool full".into(),
        Error::StartFailed { .. } => "start failed".into(),
        other => format!("other: {other}")
            .replace('\n', " ")
            .chars()
            .take(60)
            .collect(),
    }
}

/// A request line (without its newline).
pub fn request_line(id: u64, op: &Op) -> String {
    match op {
        Op::Dispatch {
            key,
            fail_for_good,
            window_ms,
        } => {
            format!(
                "{id} dispatch {key} {} {window_ms}",
                u8::from(*fail_for_good)
            )
        }
        Op::Stop { key } => format!("{id} stop {key}"),
    }
}

/// Parses a request line; `None` for a malformed one.
pub fn parse_request(line: &str) -> Option<(u64, Op)> {
    let mut parts = line.split(' ');
    let id = parts.next()?.parse().ok()?;
    let op = match (parts.next()?, parts.next()?, parts.next()) {
        ("dispatch", key, Some(flag)) => Op::Dispatch {
            key: key.to_string(),
            fail_for_good: flag == "1",
            window_ms: parts.next()?.parse().ok()?,
        },
        ("stop", key, None) => Op::Stop {
            key: key.to_string(),
        },
        _ => return None,
    };
    parts.next().is_none().then_some((id, op))
}

/// A reply line (without its newline).
pub fn reply_line(id: u64, outcome: &Outcome) -> String {
    match outcome {
        Outcome::Ok(node) => format!("{id} ok {node}"),
        Outcome::Exists => format!("{id} exists"),
        Outcome::Recent => format!("{id} recent"),
        Outcome::NotFound => format!("{id} not_found"),
        Outcome::Failed(kind) => format!("{id} error {kind}"),
    }
}

/// Parses a reply line; `None` for a malformed one.
pub fn parse_reply(line: &str) -> Option<(u64, Outcome)> {
    let (id, rest) = line.split_once(' ')?;
    let id = id.parse().ok()?;
    let (word, tail) = rest.split_once(' ').unwrap_or((rest, ""));
    let outcome = match word {
        "ok" => Outcome::Ok(tail.to_string()),
        "exists" => Outcome::Exists,
        "recent" => Outcome::Recent,
        "not_found" => Outcome::NotFound,
        "error" => Outcome::Failed(tail.to_string()),
        _ => return None,
    };
    Some((id, outcome))
}

type Waiters = Mutex<HashMap<u64, oneshot::Sender<Outcome>>>;

/// The driver's end of a worker process's request channel. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Requester {
    inner: Arc<RequesterInner>,
}

#[derive(Debug)]
struct RequesterInner {
    pid: u32,
    stdin: tokio::sync::Mutex<ChildStdin>,
    waiters: Waiters,
    next: AtomicU64,
    /// The process's stdout ended: it exited.
    closed: AtomicBool,
}

impl Requester {
    /// Wraps a process's stdin, and reads its replies from `lines` (the
    /// rest of its stdout) in a task of its own until the process exits.
    pub fn new(pid: u32, stdin: ChildStdin, lines: Lines<BufReader<ChildStdout>>) -> Requester {
        let inner = Arc::new(RequesterInner {
            pid,
            stdin: tokio::sync::Mutex::new(stdin),
            waiters: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            closed: AtomicBool::new(false),
        });
        tokio::spawn(read_replies(inner.clone(), lines));
        Requester { inner }
    }

    /// The process's OS id.
    pub fn pid(&self) -> u32 {
        self.inner.pid
    }

    /// Whether the process has exited (its stdout ended).
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    /// Sends `op` and waits up to `timeout` for its reply. A process that
    /// exits first answers `Failed("gone")`, one silent until `timeout`
    /// `Failed("no reply")` (a paused process may still carry the request
    /// out later, as a node's call that timed out may).
    pub async fn call(&self, op: &Op, timeout: Duration) -> Outcome {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        if let Ok(mut w) = self.inner.waiters.lock() {
            w.insert(id, tx);
        }
        let line = format!("{}\n", request_line(id, op));
        let sent = async {
            let mut stdin = self.inner.stdin.lock().await;
            stdin.write_all(line.as_bytes()).await?;
            stdin.flush().await
        };
        let outcome = tokio::time::timeout(timeout, async {
            if sent.await.is_err() {
                return Outcome::Failed("gone".into());
            }
            rx.await.unwrap_or_else(|_| Outcome::Failed("gone".into()))
        })
        .await
        .unwrap_or_else(|_| Outcome::Failed("no reply".into()));
        if let Ok(mut w) = self.inner.waiters.lock() {
            w.remove(&id);
        }
        outcome
    }
}

async fn read_replies(inner: Arc<RequesterInner>, mut lines: Lines<BufReader<ChildStdout>>) {
    while let Ok(Some(line)) = lines.next_line().await {
        let Some((id, outcome)) = parse_reply(&line) else {
            tracing::warn!(
                pid = inner.pid,
                line,
                "a worker process printed a line that is no reply"
            );
            continue;
        };
        let waiter = inner.waiters.lock().ok().and_then(|mut w| w.remove(&id));
        if let Some(tx) = waiter {
            let _ = tx.send(outcome);
        }
    }
    inner.closed.store(true, Ordering::Release);
    // Whoever still waits hears "gone" (its sender dropped).
    if let Ok(mut w) = inner.waiters.lock() {
        w.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_read_back_as_written() {
        for op in [
            Op::Dispatch {
                key: "job-0042".into(),
                fail_for_good: true,
                window_ms: 0,
            },
            Op::Dispatch {
                key: "job-0001".into(),
                fail_for_good: false,
                window_ms: 1500,
            },
            Op::Stop {
                key: "job-0007".into(),
            },
        ] {
            assert_eq!(parse_request(&request_line(9, &op)), Some((9, op)));
        }
        for outcome in [
            Outcome::Ok("n-proc-3".into()),
            Outcome::Exists,
            Outcome::Recent,
            Outcome::NotFound,
            Outcome::Failed("writes refused".into()),
        ] {
            assert_eq!(parse_reply(&reply_line(12, &outcome)), Some((12, outcome)));
        }
        assert_eq!(parse_request("x dispatch job-1 0 0"), None);
        assert_eq!(parse_request("1 dispatch job-1 0"), None);
        assert_eq!(parse_request("1 dispatch job-1 0 soon"), None);
        assert_eq!(parse_request("1 stop job-1 extra"), None);
        assert_eq!(parse_request("1 start job-1"), None);
        assert_eq!(parse_reply("3 maybe"), None);
    }
}
