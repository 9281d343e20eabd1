//! A live partition of a worker process that holds about a hundred jobs
//! whose `stop` takes 20–50 ms: the process keeps running, cut off from
//! Redis by a fault proxy (each way a link fails: refused, black-holed,
//! frozen open). Its lease watchdog must stop every one of its jobs before
//! any other process starts one of them — proved from the handlers' start
//! and stop lines, written on the shared monotonic clock by separate
//! processes. Healed, it rejoins and the pool rebalances without overlap.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use flotilla_integration_tests::clock::mono_ns;
use flotilla_integration_tests::ledger::{FaultKind, Line, Record, read_ledger};
use flotilla_pool::Ring;
use flotilla_testkit::{ProxyMode, wait_until};
use support::{Harness, HarnessOptions, TTL};

/// Jobs in the pool: about a third (133) on each of the three processes.
/// `FLOTILLA_PARTITION_JOBS` overrides it (e.g. 150 or 1500 for about 50
/// or 500 jobs on the cut-off process).
const JOBS: usize = 400;

fn jobs() -> usize {
    std::env::var("FLOTILLA_PARTITION_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(JOBS)
}

/// Fewest jobs the cut-off process must hold when cut: a quarter of all
/// (100 of 400 is 3.5 standard deviations below its expected share).
/// The process behind the proxy.
const VICTIM: usize = 0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_worker_with_many_jobs_stops_them_all_before_any_takeover() {
    let mut h = Harness::start_opts(
        "partition",
        HarnessOptions {
            processes: 3,
            workers_each: 1,
            stop_ms: (20, 50),
            proxied: 1,
            ..HarnessOptions::default()
        },
    )
    .await;
    let keys: Vec<String> = (0..jobs()).map(|i| format!("job-{i:04}")).collect();
    let min_victim_jobs = keys.len() / 4;
    h.dispatch(&keys).await;
    let mut figures = Vec::new();
    for mode in [ProxyMode::Refuse, ProxyMode::BlackHole, ProxyMode::Freeze] {
        wait_converged(&h, &keys, min_victim_jobs).await;
        figures.push(cut_cycle(&h, mode).await);
    }
    wait_converged(&h, &keys, min_victim_jobs).await;
    for f in &figures {
        eprintln!(
            "partition {:?}: {} jobs on the cut-off process; last stop {:.0} ms after the cut, \
             first takeover {:.0} ms after the cut, margin {:.0} ms",
            f.mode, f.jobs, f.last_stop_ms, f.first_takeover_ms, f.margin_ms
        );
    }
    let report = h.check_now();
    assert!(
        report.ok(),
        "violations: {:#?}\n{}",
        report.violations,
        key_histories(&h, &report.violations)
    );
    h.kill_all().await;
}

/// Every ledger line naming a key that a violation names, for the failure
/// message.
fn key_histories(h: &Harness, violations: &[impl std::fmt::Debug]) -> String {
    let text = format!("{violations:?}");
    let mut rows = Vec::new();
    for (i, p) in h.processes.iter().enumerate() {
        for l in read_ledger(&p.ledger).unwrap() {
            let key = match &l.record {
                Record::Start { key, .. } | Record::Stop { key, .. } => key,
                _ => continue,
            };
            if text.contains(&format!("\"{key}\"")) {
                rows.push((l.mono_ns, format!("process {i}: {:?}", l.record)));
            }
        }
    }
    rows.sort();
    rows.into_iter()
        .map(|(t, r)| format!("{:.1} ms {r}", t as f64 / 1e6))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What one cut showed.
#[derive(Debug)]
struct CutFigures {
    mode: ProxyMode,
    jobs: usize,
    last_stop_ms: f64,
    first_takeover_ms: f64,
    margin_ms: f64,
}

/// Cuts the victim off in `mode` until all its jobs run elsewhere, checks
/// that each stopped there before it started anywhere else, then heals.
async fn cut_cycle(h: &Harness, mode: ProxyMode) -> CutFigures {
    let victim_keys = h.running_on(VICTIM);
    let victim_pid = h.processes[VICTIM].pid();
    let proxy = h.proxies[VICTIM].as_ref().expect("the victim is proxied");
    proxy.set_mode(mode);
    let cut_ns = mono_ns();
    h.driver.record(Record::Fault {
        kind: FaultKind::Cut,
        target: Some(victim_pid),
        end: false,
    });
    let others: Vec<_> = (0..h.processes.len())
        .filter(|i| *i != VICTIM)
        .map(|i| h.processes[i].ledger.clone())
        .collect();
    wait_until(
        Duration::from_secs(20),
        "every job of the cut-off process started elsewhere",
        || {
            let started: HashSet<String> = others
                .iter()
                .flat_map(|p| first_starts_after(&read_ledger(p).unwrap(), cut_ns).into_keys())
                .collect();
            let done = victim_keys.iter().all(|k| started.contains(k));
            async move { done }
        },
    )
    .await
    .unwrap();

    // Each key: the victim's stop after the cut, and the first start
    // elsewhere after the cut.
    let stops = stops_after(&read_ledger(&h.processes[VICTIM].ledger).unwrap(), cut_ns);
    let mut takeovers: HashMap<String, u64> = HashMap::new();
    for p in &others {
        for (k, t) in first_starts_after(&read_ledger(p).unwrap(), cut_ns) {
            let e = takeovers.entry(k).or_insert(t);
            *e = (*e).min(t);
        }
    }
    let mut late = Vec::new();
    for key in &victim_keys {
        let takeover = takeovers[key];
        match stops.get(key) {
            Some(stop) if *stop < takeover => {}
            Some(stop) => late.push(format!(
                "{key}: stopped on the cut-off process {:.1} ms after it started elsewhere",
                (*stop - takeover) as f64 / 1e6
            )),
            None => late.push(format!(
                "{key}: never stopped on the cut-off process, started elsewhere {:.0} ms after the cut",
                (takeover - cut_ns) as f64 / 1e6
            )),
        }
    }
    assert!(
        late.is_empty(),
        "{mode:?}: {} of {} jobs ran twice:\n{}",
        late.len(),
        victim_keys.len(),
        late.join("\n")
    );
    let last_stop = victim_keys.iter().map(|k| stops[k]).max().unwrap_or(cut_ns);
    let first_takeover = victim_keys
        .iter()
        .map(|k| takeovers[k])
        .min()
        .unwrap_or(cut_ns);

    proxy.heal();
    h.driver.record(Record::Fault {
        kind: FaultKind::Cut,
        target: Some(victim_pid),
        end: true,
    });
    let ms = |ns: u64| (ns.saturating_sub(cut_ns)) as f64 / 1e6;
    CutFigures {
        mode,
        jobs: victim_keys.len(),
        last_stop_ms: ms(last_stop),
        first_takeover_ms: ms(first_takeover),
        margin_ms: (first_takeover as f64 - last_stop as f64) / 1e6,
    }
}

/// Waits until the pool settled: every process sees every worker in the
/// ring, every key runs on exactly one process — the one whose worker the
/// ring names — and the proxied process holds at least `min_victim`. On
/// timeout the message says which of these was still missing.
async fn wait_converged(h: &Harness, keys: &[String], min_victim: usize) {
    let mut last = String::new();
    let settled = wait_until(TTL * 10, "every key runs once, on its ring owner", || {
        let gaps = convergence_gaps(h, keys, min_victim);
        let ok = gaps.is_empty();
        last = gaps.join("; ");
        async move { ok }
    })
    .await;
    if let Err(e) = settled {
        panic!("{e}: still {last}");
    }
}

/// What keeps the pool from having settled, empty when it has.
fn convergence_gaps(h: &Harness, keys: &[String], min_victim: usize) -> Vec<String> {
    let workers: Vec<&String> = h.processes.iter().flat_map(|p| &p.workers).collect();
    let mut gaps = Vec::new();
    for (i, p) in h.processes.iter().enumerate() {
        let ring = read_ledger(&p.ledger)
            .unwrap()
            .into_iter()
            .rev()
            .find_map(|l| match l.record {
                Record::Ring { workers } => Some(workers),
                _ => None,
            });
        match ring {
            Some(r) if r.len() == workers.len() && workers.iter().all(|w| r.contains(w)) => {}
            r => gaps.push(format!("process {i} sees the ring {r:?}, not {workers:?}")),
        }
    }
    let ring = Ring::new(workers.iter().map(|w| w.as_str()));
    let per_process: Vec<HashSet<String>> =
        (0..h.processes.len()).map(|i| h.running_on(i)).collect();
    let mut misplaced = Vec::new();
    for k in keys {
        let on: Vec<usize> = (0..per_process.len())
            .filter(|i| per_process[*i].contains(k))
            .collect();
        let owner = ring.owner(k).and_then(|o| {
            h.processes
                .iter()
                .position(|p| p.workers.iter().any(|w| w == o))
        });
        if on.len() != 1 || owner != Some(on[0]) {
            misplaced.push(format!("{k} runs on {on:?}, owner process {owner:?}"));
        }
    }
    if !misplaced.is_empty() {
        gaps.push(format!(
            "{} keys misplaced (first: {})",
            misplaced.len(),
            misplaced
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if per_process[VICTIM].len() < min_victim {
        gaps.push(format!(
            "the proxied process runs {} keys, fewer than {min_victim}",
            per_process[VICTIM].len()
        ));
    }
    gaps
}

/// The first start (`starts`) or stop of each key after `after_ns`.
fn first_after(lines: &[Line], after_ns: u64, starts: bool) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for l in lines.iter().filter(|l| l.mono_ns > after_ns) {
        let key = match &l.record {
            Record::Start { key, .. } if starts => key,
            Record::Stop { key, .. } if !starts => key,
            _ => continue,
        };
        out.entry(key.clone()).or_insert(l.mono_ns);
    }
    out
}

/// The first start of each key after `after_ns`.
fn first_starts_after(lines: &[Line], after_ns: u64) -> HashMap<String, u64> {
    first_after(lines, after_ns, true)
}

/// The first stop of each key after `after_ns`.
fn stops_after(lines: &[Line], after_ns: u64) -> HashMap<String, u64> {
    first_after(lines, after_ns, false)
}
