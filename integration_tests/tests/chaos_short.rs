//! The short CI version of the chaos suite (the long soak is the `chaos`
//! program: `cargo run --release -p flotilla-integration-tests --bin chaos -- --duration 30m`).

use std::time::Duration;

use flotilla_integration_tests::driver::{ChaosOptions, run};
use flotilla_integration_tests::ledger::FaultKind;

fn options(seconds: u64, faults: Vec<FaultKind>) -> ChaosOptions {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    // 48 keys, as before the soak's default rose to 280: with hundreds of
    // starts in flight, a pause can land between a handler's `start` and
    // the record of that start, and the cleaner then moves the entry with
    // the same fencing token (Finding 13 in the README, open). The soak
    // (`chaos`) runs with 280.
    let options = ChaosOptions::default()
        .duration(Duration::from_secs(seconds))
        .worker_processes(4)
        .seed(7)
        .keys(48)
        .faults(faults)
        .worker_binary(env!("CARGO_BIN_EXE_flotilla-test-worker").into());
    // Keep the ledgers of a run for `chaos --recheck` (e.g. to study a
    // failure): FLOTILLA_CHAOS_LEDGERS=/some/dir. One directory per test
    // and process: tests of one binary run at once, several with the same
    // duration, and a directory holding another run's ledgers is refused.
    // The test runs on a thread named after it.
    match std::env::var_os("FLOTILLA_CHAOS_LEDGERS") {
        Some(dir) => {
            let test = std::thread::current()
                .name()
                .unwrap_or("test")
                .replace("::", "-");
            options.ledger_dir(
                std::path::PathBuf::from(dir).join(format!("{}-{test}", std::process::id())),
            )
        }
        None => options,
    }
}

/// Process crashes and membership changes: SIGKILL, add and remove worker
/// processes, with two dispatchers racing and stopping jobs throughout.
/// Processes come back under the node ids of those that ended, and a
/// dispatcher restarts under its own (`restart-dispatcher`): each new run
/// shares its reply stream with the one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_short_kills_and_membership_changes() {
    let summary = run(options(
        40,
        vec![
            FaultKind::Kill,
            FaultKind::AddWorker,
            FaultKind::RemoveWorker,
            FaultKind::RestartDispatcher,
        ],
    )
    .fixed_node_ids(true))
    .await
    .expect("chaos harness");
    println!("{}", summary.table());
    assert!(
        summary.faults.values().sum::<u64>() >= 6,
        "{}",
        summary.table()
    );
    assert!(summary.dispatch_ok > 50, "{}", summary.table());
    assert!(summary.passed(), "{}", summary.table());
}

/// Every fault kind but `rollback` and `outage-kill` (they have their own
/// test below) and `rollback-far` (8–25 s each: the soak runs it), including pauses, live cuts of the busiest process, Redis
/// restarts and losses while the pool recovers (`rollback-twice`,
/// `loss-kill`). It caught five pool bugs, all fixed since (README,
/// Findings).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_short_all_faults() {
    let faults = FaultKind::ALL
        .into_iter()
        .filter(|k| {
            !matches!(
                k,
                FaultKind::Rollback | FaultKind::OutageThenKill | FaultKind::RollbackFar
            )
        })
        .collect();
    let summary = run(options(60, faults)).await.expect("chaos harness");
    println!("{}", summary.table());
    assert!(summary.passed(), "{}", summary.table());
}

/// Stops only Redis knew of, lost with it: a short-lived client stops jobs
/// of the newest worker process (which came to it by hand-offs) and exits,
/// that process is removed, and Redis loses its data or goes back to
/// before the stops (`stop-leave`). The workers that handed those jobs off
/// must not give them back: before they learnt which of their hand-offs
/// had ended, a 3-minute run of this fault with `add` undid 155 stops
/// (Finding 18); and the workers the removed process left its memory
/// with must make the stops stand (Finding 19).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_short_stops_before_a_scale_down_and_a_loss() {
    let faults = vec![FaultKind::StopLeave, FaultKind::AddWorker];
    let summary = run(options(40, faults).lean_nodes(true))
        .await
        .expect("chaos harness");
    println!("{}", summary.table());
    let injected = summary
        .faults
        .get(&FaultKind::StopLeave)
        .copied()
        .unwrap_or(0);
    assert!(injected >= 3, "{}", summary.table());
    assert!(summary.stop_ok > 20, "{}", summary.table());
    assert!(summary.passed(), "{}", summary.table());
}

/// Redis going back in time (killed and restarted from an older snapshot)
/// and outages longer than the lease followed by a worker process's
/// SIGKILL, with half the nodes lean (`NodeOptions::mirror_jobs(false)`:
/// one of the two dispatchers and every other worker process), which see a
/// rollback only through the keep-alive map and the server's run id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_short_rollbacks_and_outage_kills() {
    let faults = vec![
        FaultKind::Rollback,
        FaultKind::OutageThenKill,
        FaultKind::Kill,
        FaultKind::AddWorker,
    ];
    let summary = run(options(45, faults).lean_nodes(true))
        .await
        .expect("chaos harness");
    println!("{}", summary.table());
    let rollbacks = summary
        .faults
        .get(&FaultKind::Rollback)
        .copied()
        .unwrap_or(0);
    assert!(rollbacks >= 2, "{}", summary.table());
    assert!(summary.dispatch_ok > 50, "{}", summary.table());
    assert!(summary.passed(), "{}", summary.table());
}

/// Faults during recoveries (`ChaosOptions::overlap`): each fault comes
/// 0–2 TTLs after the last, so a pause or a cut lands while workers
/// re-assert after a rollback or an empty restart, and a loss lands while
/// the orphans of the last one wait out their grace (the `--overlap` soak
/// found such orphans lost, README "Faults during recoveries").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_short_overlapping_losses_pauses_and_cuts() {
    let faults = vec![
        FaultKind::Rollback,
        FaultKind::RestartEmpty,
        FaultKind::PauseRollback,
        FaultKind::Pause,
        FaultKind::Cut,
    ];
    let summary = run(options(45, faults).lean_nodes(true).overlap(true))
        .await
        .expect("chaos harness");
    println!("{}", summary.table());
    assert!(
        summary.faults.values().sum::<u64>() >= 8,
        "{}",
        summary.table()
    );
    assert!(summary.dispatch_ok > 50, "{}", summary.table());
    assert!(summary.passed(), "{}", summary.table());
}

/// Redis refusing work while it keeps its data (`oom`, `read-only`:
/// every write and function call refused for 0.25–2.5 TTLs;
/// `drop-clients`: every connection closed), between rollbacks and
/// membership changes that make workers move jobs meanwhile. A 6-minute
/// soak of this mix found a job stopped to be moved, whose hand-off and
/// restart were refused, forgotten where Redis had lost it
/// (`src/tests/refused_writes.rs` in the pool crate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_short_writes_refused_and_connections_dropped() {
    let faults = vec![
        FaultKind::OutOfMemory,
        FaultKind::ReadOnly,
        FaultKind::DropClients,
        FaultKind::Rollback,
        FaultKind::AddWorker,
        FaultKind::RemoveWorker,
    ];
    let summary = run(options(45, faults).lean_nodes(true).overlap(true))
        .await
        .expect("chaos harness");
    println!("{}", summary.table());
    let refusals: u64 = [FaultKind::OutOfMemory, FaultKind::ReadOnly]
        .iter()
        .filter_map(|k| summary.faults.get(k))
        .sum();
    assert!(refusals >= 2, "{}", summary.table());
    assert!(summary.dispatch_ok > 50, "{}", summary.table());
    assert!(summary.passed(), "{}", summary.table());
}

/// Jobs that end on their own (`--lifecycle`: 1 key in 8 fails every few
/// seconds and is restarted after a backoff, 1 in 8 finishes) through
/// rollbacks, empty restarts, lease losses and membership changes, on a
/// shorter TTL (1 s) with more workers per process. The first 6-minute
/// soak of this mode found a finished run started again (its end recorded
/// as the lease lapsed) and failed jobs dropped when Redis had lost their
/// record (`src/tests/resume.rs` in the pool crate). Half the failing keys
/// fail for good on their second failure in a row: such an end must hold
/// like a finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_short_jobs_that_fail_and_finish() {
    let faults = vec![
        FaultKind::Rollback,
        FaultKind::RestartEmpty,
        FaultKind::PauseRollback,
        FaultKind::Cut,
        FaultKind::Kill,
        FaultKind::AddWorker,
        FaultKind::RemoveWorker,
    ];
    let summary = run(options(45, faults)
        .keys(160)
        .ttl(Duration::from_secs(1))
        .stop_ms(0, 150)
        .workers_per_process(3)
        .lifecycle(true)
        .fail_for_good(true)
        .lean_nodes(true)
        .overlap(true))
    .await
    .expect("chaos harness");
    println!("{}", summary.table());
    assert!(summary.report.finishes_checked > 10, "{}", summary.table());
    assert!(summary.dispatch_ok > 50, "{}", summary.table());
    assert!(summary.passed(), "{}", summary.table());
}

/// Ledgers are appended to: a run pointed at a directory that holds an
/// earlier run's ledgers would be judged together with that run (its open
/// runs overlap every later one). Such a directory is refused before
/// anything starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_dir_holding_an_earlier_run_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("worker-1.jsonl"), "{}\n").unwrap();
    let t0 = std::time::Instant::now();
    let result = run(options(5, vec![FaultKind::Kill]).ledger_dir(dir.path().to_path_buf())).await;
    match result {
        Err(e @ flotilla_integration_tests::driver::ChaosError::LedgerDirInUse(_)) => {
            let text = e.to_string();
            assert!(text.contains("--ledger-dir"), "{text}");
            println!("refused in {:?}: {text}", t0.elapsed());
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(summary) => panic!("ran on an earlier run's ledgers:\n{}", summary.table()),
    }
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "nothing may start first"
    );
}

/// A chaos run that is still going after its directory was removed and
/// made again (a background run that ignored SIGINT) writes the ledgers of
/// the worker processes it adds into the new run's directory, under the
/// new run's file names: the checker then judged two pools' jobs as one
/// and reported 16,852 violations of a clean run. A ledger written by more
/// than one process now fails the run with an error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_another_run_wrote_into_fails_the_run() {
    use flotilla_integration_tests::driver::ChaosError;
    use flotilla_integration_tests::ledger::{Line, Record};
    use std::io::Write;

    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("worker-1.jsonl");
    // Another run's worker process appends a start of its own.
    let foreign = {
        let ledger = ledger.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while !ledger.exists() {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "worker-1.jsonl never appeared"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let line = Line {
                // No process has this id (Linux caps pids at 2^22).
                pid: u32::MAX - 1,
                mono_ns: 1,
                server_us: 0,
                record: Record::Start {
                    key: "job-0000".into(),
                    token: 1,
                    worker: "w-of-another-run".into(),
                    admitted_ms: None,
                },
            };
            let mut text = serde_json::to_string(&line).unwrap();
            text.push('\n');
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .open(&ledger)
                .unwrap();
            file.write_all(text.as_bytes()).unwrap();
        })
    };
    let result =
        run(options(5, vec![FaultKind::AddWorker]).ledger_dir(dir.path().to_path_buf())).await;
    foreign.await.unwrap();
    match result {
        Err(e @ ChaosError::MixedLedger { .. }) => {
            let text = e.to_string();
            assert!(text.contains("worker-1.jsonl"), "{text}");
            assert!(text.contains("another run"), "{text}");
            println!("{text}");
        }
        Err(e) => panic!("failed for another reason: {e}"),
        Ok(summary) => panic!("judged a ledger of two runs:\n{}", summary.table()),
    }
}

/// Handler stops longer than the workers' stop budget (a sixth of the TTL:
/// 333 ms here) break the handler contract: the pool counts an overrun
/// stop as done and may start the key elsewhere while the old handler still
/// runs. A soak with `--stop-max-ms 400` reported 7,808 violations that
/// way (12,864 "handler stop overran its budget" errors in its log). Such
/// options are refused before anything starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_stops_longer_than_the_stop_budget_are_refused() {
    use flotilla_integration_tests::driver::ChaosError;

    let t0 = std::time::Instant::now();
    let result = run(options(5, vec![FaultKind::Kill]).stop_ms(0, 400)).await;
    match result {
        Err(e @ ChaosError::StopsOverBudget { .. }) => {
            let text = e.to_string();
            assert!(text.contains("--stop-max-ms 333"), "{text}");
            println!("refused in {:?}: {text}", t0.elapsed());
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(summary) => panic!("ran with stops over budget:\n{}", summary.table()),
    }
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "nothing may start first"
    );
    // At the budget itself the options are taken: a 1-second run goes
    // through and passes.
    let within = run(options(1, vec![FaultKind::AddWorker]).stop_ms(0, 333))
        .await
        .expect("a run whose stops stay within the budget");
    assert!(within.passed(), "{}", within.table());
}

/// Handlers whose `start` takes up to 1.5 s (three quarters of the TTL),
/// through live cuts, pauses, writes refused, kills and membership
/// changes. A 6-minute soak of slow starts (up to 3 s) found starts that
/// ran on past a lapsed lease, slow fresh starts whose guard lapsed under
/// them, and start entries forwarded to a new ring owner while their run
/// went on here (`src/tests/slow_starts.rs` and
/// `src/tests/unrecorded_start.rs` in the pool crate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_short_slow_starts() {
    let faults = vec![
        FaultKind::Cut,
        FaultKind::Pause,
        FaultKind::ReadOnly,
        FaultKind::Kill,
        FaultKind::AddWorker,
        FaultKind::RemoveWorker,
    ];
    let summary = run(options(45, faults)
        .start_max_ms(1500)
        .lean_nodes(true)
        .overlap(true))
    .await
    .expect("chaos harness");
    println!("{}", summary.table());
    assert!(summary.dispatch_ok > 30, "{}", summary.table());
    assert!(summary.passed(), "{}", summary.table());
}

/// Half the dispatches and stops sent through the worker processes' own
/// nodes (`--requests-from-workers`): the node asking holds jobs, and is
/// cut, paused, killed or closed while its calls are in flight, and the
/// stops it was answered for must hold through the rollbacks after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_short_requests_from_the_workers() {
    let faults = vec![
        FaultKind::Cut,
        FaultKind::Pause,
        FaultKind::Kill,
        FaultKind::CutRollback,
        FaultKind::Rollback,
        FaultKind::StopLeave,
        FaultKind::AddWorker,
    ];
    let summary = run(options(40, faults)
        .requests_from_workers(true)
        .lean_nodes(true)
        .overlap(true))
    .await
    .expect("chaos harness");
    println!("{}", summary.table());
    assert!(summary.via_workers > 50, "{}", summary.table());
    assert!(summary.dispatch_ok > 30, "{}", summary.table());
    assert!(summary.passed(), "{}", summary.table());
}

/// Operators' drains (`Node::drain_worker`) of the busiest process's
/// workers, half of them with that process cut off while it hands its jobs
/// off, then undrains that bring jobs back, among cuts, pauses during
/// which Redis goes back in time, and added processes, overlapping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_short_drains_under_partitions() {
    let faults = vec![
        FaultKind::Drain,
        FaultKind::Cut,
        FaultKind::Drain,
        FaultKind::PauseRollback,
        FaultKind::AddWorker,
    ];
    let summary = run(options(45, faults).lean_nodes(true).overlap(true))
        .await
        .expect("chaos harness");
    println!("{}", summary.table());
    let drains = summary.faults.get(&FaultKind::Drain).copied().unwrap_or(0);
    assert!(drains >= 3, "{}", summary.table());
    assert!(summary.passed(), "{}", summary.table());
}

/// A third of the keys dispatched with an idempotency window
/// (`--window-ms`), half the requests through the worker processes, with
/// runs that finish and fail on their own: no windowed admission of a key
/// may follow another within the window where Redis kept its data and
/// clock, through cuts, kills, a frozen Redis, a cut dispatcher, and a
/// rollback and a clock step (which may forget a marker, and are excused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_short_windowed_dispatches() {
    let faults = vec![
        FaultKind::Cut,
        FaultKind::Kill,
        FaultKind::FreezeRedis,
        FaultKind::CutDispatcher,
        FaultKind::Rollback,
        FaultKind::ClockStep,
        FaultKind::AddWorker,
    ];
    let summary = run(options(45, faults)
        .keys(120)
        .ttl(Duration::from_secs(1))
        .window_ms(3_000)
        .lifecycle(true)
        .fail_for_good(true)
        .requests_from_workers(true)
        .lean_nodes(true)
        .overlap(true))
    .await
    .expect("chaos harness");
    println!("{}", summary.table());
    assert!(summary.windowed_ok > 20, "{}", summary.table());
    assert!(summary.dispatch_recent > 10, "{}", summary.table());
    assert!(summary.passed(), "{}", summary.table());
}

/// Redis holding every write (`CLIENT PAUSE … WRITE`) for 0.5–2 TTLs while
/// reads, blocking inbox reads and messages go on, among cuts, kills,
/// process pauses and added processes, overlapping: the held renewals,
/// starts and cleanups run late and all at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_short_paused_writes() {
    let faults = vec![
        FaultKind::PauseWrites,
        FaultKind::Cut,
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::AddWorker,
    ];
    let summary = run(options(45, faults)
        .ttl(Duration::from_secs(1))
        .stop_ms(0, 150)
        .lifecycle(true)
        .requests_from_workers(true)
        .lean_nodes(true)
        .overlap(true))
    .await
    .expect("chaos harness");
    println!("{}", summary.table());
    let paused = summary
        .faults
        .get(&FaultKind::PauseWrites)
        .copied()
        .unwrap_or(0);
    assert!(paused >= 3, "{}", summary.table());
    assert!(summary.dispatch_ok > 30, "{}", summary.table());
    assert!(summary.passed(), "{}", summary.table());
}

/// A schedule run by the worker processes (`--schedule-keys`): its leader
/// is one of the processes the faults cut off, pause, kill and remove, and
/// Redis is rolled back and frozen meanwhile; the leader keeps starting
/// the keys that come back into the wanted set and stopping those that
/// leave it. Its starts and stops are held to I1–I3 as dispatches and
/// stops are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_short_scheduled_jobs() {
    let faults = vec![
        FaultKind::Cut,
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Rollback,
        FaultKind::FreezeRedis,
        FaultKind::RemoveWorker,
        FaultKind::AddWorker,
    ];
    let summary = run(options(45, faults)
        .ttl(Duration::from_secs(1))
        .schedule_keys(32)
        .lifecycle(true)
        .lean_nodes(true)
        .overlap(true))
    .await
    .expect("chaos harness");
    println!("{}", summary.table());
    assert!(summary.scheduled.0 > 20, "{}", summary.table());
    assert!(summary.scheduled.1 > 20, "{}", summary.table());
    assert!(summary.passed(), "{}", summary.table());
}
