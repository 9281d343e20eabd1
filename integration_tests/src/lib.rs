//! Process-level tests and the chaos suite of Flotilla.
//!
//! * [`ledger`]: the append-only JSON-lines ledgers that worker processes
//!   and the driver write (starts, stops, ring views, admissions, stop
//!   requests, faults), each line stamped with the host's monotonic clock
//!   and an estimate of Redis server time ([`clock`]).
//! * [`checker`]: checks invariants I1–I4 over those ledgers.
//! * [`lifecycle`]: jobs that end on their own (fail and restart, or
//!   finish), for runs with `--lifecycle`.
//! * [`process`]: spawns `flotilla-test-worker` processes (killed on drop)
//!   and signals them (`SIGKILL`, `SIGSTOP`/`SIGCONT`, `SIGTERM`).
//! * [`requests`]: dispatches and stops sent through a worker process's
//!   own node (`chaos --requests-from-workers`).
//! * [`schedules`]: a schedule run by the worker processes
//!   (`chaos --schedule-keys`), whose starts and stops the checker holds
//!   to what it holds dispatches and stops to.
//! * [`windows`]: dispatches with an idempotency window
//!   (`chaos --window-ms`), whose promise the checker holds them to.
//! * [`driver`]: the chaos driver: dispatchers, worker processes behind
//!   fault proxies, a fault schedule, a recovery window and the checker.
//!
//! See `README.md` for the programs and tests.
//!
//! ```no_run
//! use flotilla_integration_tests::checker::{check, CheckOptions};
//! use flotilla_integration_tests::ledger::read_ledger;
//!
//! let ledgers = vec![read_ledger(std::path::Path::new("worker-1.jsonl")).unwrap()];
//! let report = check(&ledgers, &CheckOptions::default());
//! for v in &report.violations {
//!     println!("{v}");
//! }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod checker;
pub mod clock;
pub mod driver;
mod fault_kind;
pub mod ledger;
pub mod lifecycle;
pub mod process;
pub mod requests;
pub mod schedules;
pub mod windows;
