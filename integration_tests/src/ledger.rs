//! The append-only ledgers that worker processes and the driver write, one
//! JSON object a line, flushed (one `write` call) at each event.
//!
//! A worker process records each handler `start` and `stop`, its ring view
//! when it changes, and a ready line once its workers are registered. The
//! driver (or a test) records what it asked and what it got: admissions
//! (`dispatch_job` returned `Ok`), stop requests and their outcome, and every
//! fault it injected.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::clock::{ServerClock, mono_ns};
pub use crate::fault_kind::FaultKind;

/// One ledger line: who, when, what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    /// OS process id of the writer.
    pub pid: u32,
    /// Host `CLOCK_MONOTONIC`, ns.
    pub mono_ns: u64,
    /// Estimated Redis server time, µs (0 when unknown).
    pub server_us: u64,
    /// The event.
    #[serde(flatten)]
    pub record: Record,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Record {
    /// A worker process registered its workers.
    Ready {
        /// The worker ids.
        workers: Vec<String>,
    },
    /// A handler's `start` ran.
    Start {
        /// Job key.
        key: String,
        /// Fencing token of this start.
        token: u64,
        /// Worker id.
        worker: String,
        /// When the admission this run comes from was made: the job's
        /// creation time (Redis server time, ms), which moves, requeues and
        /// restarts keep. Absent from ledgers written before it was
        /// recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        admitted_ms: Option<u64>,
    },
    /// A handler's `stop` ran.
    Stop {
        /// Job key.
        key: String,
        /// Worker id.
        worker: String,
    },
    /// A run ended on its own (lifecycle keys, see the worker's
    /// `--lifecycle`): the handler's work stopped and it reported the end
    /// through the job's `JobOutcome`. The run ends here; the pool then
    /// records the end (`finished`: the job leaves the pool) or restarts
    /// the job after a backoff (`failed`).
    Ended {
        /// Job key.
        key: String,
        /// Worker id.
        worker: String,
        /// Fencing token of the run.
        token: u64,
        /// `finished` or `failed`.
        outcome: String,
    },
    /// The pool recorded a finished run in Redis (the worker logged
    /// `job finished`), or a run's failure as final (`job failed too
    /// often; not restarted`): the job left the pool, and no run of the key
    /// may follow until it is dispatched again.
    Finished {
        /// Job key.
        key: String,
        /// Fencing token of the run that ended.
        token: u64,
    },
    /// The pool's active workers (the ring) as a worker process sees them.
    Ring {
        /// Active worker ids, sorted.
        workers: Vec<String>,
    },
    /// The worker process's lease watchdog fired (the pool's
    /// `flotilla_pool_lease_lost_total` counter went up): it is about to
    /// stop every local job.
    LeaseLost,
    /// A `dispatch_job` is about to be sent.
    DispatchSent {
        /// Job key.
        key: String,
    },
    /// `dispatch_job` returned `Ok`: the pool admitted the key.
    Admit {
        /// Job key.
        key: String,
        /// Dispatching node.
        node: String,
        /// The dispatch's idempotency window (ms), if it had one (see
        /// [`crate::windows`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        window_ms: Option<u64>,
    },
    /// A dispatch with an idempotency window returned `AlreadyDispatched`:
    /// the key was admitted less than a window ago and neither runs nor
    /// waits to start.
    Recent {
        /// Job key.
        key: String,
    },
    /// `dispatch_job` returned `JobExists`: the key runs or is pending.
    Exists {
        /// Job key.
        key: String,
    },
    /// `dispatch_job` failed in a way that leaves open whether the job
    /// starts (timeout, Redis unavailable).
    DispatchUnknown {
        /// Job key.
        key: String,
    },
    /// A `stop_job` is about to be sent.
    StopSent {
        /// Job key.
        key: String,
    },
    /// A `stop_job` returned.
    StopDone {
        /// Job key.
        key: String,
        /// `ok`, `not_found` or `unknown` (an error that leaves it open).
        outcome: String,
        /// The worker process whose node asked (`--requests-from-workers`);
        /// absent: one of the driver's dispatching nodes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        via: Option<u32>,
    },
    /// The driver injected a fault (`end: false`) or ended one (`end: true`).
    Fault {
        /// The fault.
        kind: FaultKind,
        /// The process it hit, if one.
        target: Option<u32>,
        /// Whether this ends the fault (heal, resume, restarted).
        end: bool,
    },
}

/// Appends lines to a ledger file; cheap to clone, safe to share.
#[derive(Debug, Clone)]
pub struct LedgerWriter {
    file: Arc<Mutex<File>>,
    clock: ServerClock,
    pid: u32,
}

impl LedgerWriter {
    /// Opens (creates) `path` for appending.
    ///
    /// # Errors
    /// I/O errors.
    pub fn open(path: &Path, clock: ServerClock) -> std::io::Result<LedgerWriter> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(LedgerWriter {
            file: Arc::new(Mutex::new(file)),
            clock,
            pid: std::process::id(),
        })
    }

    /// Records `record` now. A line is written with one `write` call, so it
    /// is on disk (in the page cache) when this returns, even if the process
    /// is killed right after.
    pub fn record(&self, record: Record) -> Line {
        let line = Line {
            pid: self.pid,
            mono_ns: mono_ns(),
            server_us: self.clock.now_us(),
            record,
        };
        let mut text = serde_json::to_string(&line).unwrap_or_default();
        text.push('\n');
        match self.file.lock() {
            Ok(mut f) => {
                if let Err(e) = f.write_all(text.as_bytes()) {
                    tracing::error!(error = %e, "ledger write failed");
                }
            }
            Err(_) => tracing::error!("ledger lock poisoned"),
        }
        line
    }

    /// The server clock this writer stamps lines with.
    pub fn clock(&self) -> &ServerClock {
        &self.clock
    }
}

/// The processes that wrote `lines`, in the order they first appear. Each
/// process of a run writes a ledger of its own, so more than one means that
/// something else (another run) wrote into the file as well.
pub fn writers(lines: &[Line]) -> Vec<u32> {
    let mut pids = Vec::new();
    for line in lines {
        if !pids.contains(&line.pid) {
            pids.push(line.pid);
        }
    }
    pids
}

/// Reads every complete line of a ledger file (a torn last line, from a
/// process killed mid-write, is skipped).
///
/// # Errors
/// I/O errors.
pub fn read_ledger(path: &Path) -> std::io::Result<Vec<Line>> {
    let mut tail = LedgerTail::new(path.to_path_buf());
    tail.read_new()
}

/// Reads ledger files incrementally: each call returns the lines appended
/// since the last one.
#[derive(Debug)]
pub struct LedgerTail {
    path: PathBuf,
    offset: u64,
}

impl LedgerTail {
    /// A tail at the start of `path` (which may not exist yet).
    pub fn new(path: PathBuf) -> LedgerTail {
        LedgerTail { path, offset: 0 }
    }

    /// The file this tail reads.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The complete lines appended since the last call.
    ///
    /// # Errors
    /// I/O errors other than a missing file.
    pub fn read_new(&mut self) -> std::io::Result<Vec<Line>> {
        let mut file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        file.seek(SeekFrom::Start(self.offset))?;
        let mut reader = BufReader::new(file);
        let mut out = Vec::new();
        let mut buf = String::new();
        loop {
            buf.clear();
            let n = reader.read_line(&mut buf)?;
            if n == 0 || !buf.ends_with('\n') {
                break; // end, or a line still being written
            }
            self.offset += n as u64;
            match serde_json::from_str::<Line>(buf.trim_end()) {
                Ok(line) => out.push(line),
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "bad ledger line skipped")
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_tail_reads_only_new_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.jsonl");
        let w = LedgerWriter::open(&path, ServerClock::new()).unwrap();
        let first = w.record(Record::Start {
            key: "k".into(),
            token: 7,
            worker: "w".into(),
            admitted_ms: Some(1),
        });
        let mut tail = LedgerTail::new(path.clone());
        assert_eq!(tail.read_new().unwrap(), vec![first]);
        let second = w.record(Record::Fault {
            kind: FaultKind::Pause,
            target: Some(3),
            end: true,
        });
        // A torn line (no newline yet) is not returned.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"pid\":1")
            .unwrap();
        assert_eq!(tail.read_new().unwrap(), vec![second]);
        assert_eq!(read_ledger(&path).unwrap().len(), 2);
    }
}
