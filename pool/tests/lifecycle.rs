//! A job's life after its start: a task that returns `Ok` finishes the job
//! (the key can be dispatched again at once); one that returns `Err` or
//! panics is restarted after growing backoff delays, with a new fencing
//! token each run, and marked failed after too many failures; a stop
//! during the backoff holds; a worker that dies during the backoff has the
//! job restarted elsewhere, once.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_pool::{DispatchOptions, Error, JobStatus, Node, RestartPolicy, TaskHandler, Worker};
use flotilla_testkit::FaultProxy;
use support::{Env, fast};
use tokio::time::Instant;

/// One start of a job task: key, worker, token, when.
type Start = (String, String, u64, Instant);

#[derive(Clone, Default)]
struct Starts(Arc<Mutex<Vec<Start>>>);

impl Starts {
    fn of(&self, key: &str) -> Vec<Start> {
        let all = self.0.lock().unwrap();
        all.iter().filter(|s| s.0 == key).cloned().collect()
    }
}

/// A worker whose tasks act on their payload: `ok` finishes at once, `err`
/// fails at once, `panic` panics, `fail-on:<worker>` fails on that worker
/// and runs on any other, anything else runs until stopped.
async fn worker(node: &Node, name: &str, starts: &Starts) -> Worker {
    let starts = starts.clone();
    let name = name.to_string();
    Worker::new(
        node,
        TaskHandler::new(move |job, cancel| {
            starts.0.lock().unwrap().push((
                job.key.clone(),
                name.clone(),
                job.fencing_token,
                Instant::now(),
            ));
            let name = name.clone();
            async move {
                match &job.payload[..] {
                    b"ok" => Ok(()),
                    b"err" => Err("boom".into()),
                    b"panic" => panic!("kaboom"),
                    p if p == format!("fail-on:{name}").as_bytes() => Err("bad host".into()),
                    _ => {
                        cancel.cancelled().await;
                        Ok(())
                    }
                }
            }
        }),
    )
    .await
    .unwrap()
}

async fn status_becomes(
    node: &Node,
    key: &str,
    within: Duration,
    mut wanted: impl FnMut(&Option<JobStatus>) -> bool,
) -> Option<JobStatus> {
    let deadline = Instant::now() + within;
    loop {
        let status = node.job_status(key).await.unwrap();
        if wanted(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{key}: still {status:?} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn policy(first_ms: u64, max_failures: u32) -> RestartPolicy {
    RestartPolicy::default()
        .first_delay(Duration::from_millis(first_ms))
        .max_delay(Duration::from_secs(5))
        .max_failures(max_failures)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_job_leaves_the_pool_and_its_key_is_free_at_once() {
    let env = Env::new("life-ok");
    let node = env.node(fast()).await;
    let starts = Starts::default();
    let _w = worker(&node, "w0", &starts).await;

    node.dispatch_job("report", &b"ok"[..]).await.unwrap();
    let dispatched = Instant::now();
    status_becomes(&node, "report", Duration::from_secs(1), |s| s.is_none()).await;
    assert_eq!(node.job_payload("report").await.unwrap(), None);
    // Dispatched again within 1 s of the first run's end.
    node.dispatch_job("report", &b"ok"[..]).await.unwrap();
    assert!(
        dispatched.elapsed() < Duration::from_secs(1),
        "{:?}",
        dispatched.elapsed()
    );
    status_becomes(&node, "report", Duration::from_secs(1), |s| s.is_none()).await;
    let runs = starts.of("report");
    assert_eq!(runs.len(), 2);
    assert!(runs[1].2 > runs[0].2, "tokens must increase: {runs:?}");
    node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_jobs_restart_with_growing_gaps_then_fail() {
    let env = Env::new("life-err");
    let node = env.node(fast()).await;
    let starts = Starts::default();
    let _w = worker(&node, "w0", &starts).await;
    let per_dispatch = DispatchOptions::default().restart_policy(policy(100, 4));

    node.dispatch_job_with("flaky", &b"err"[..], &per_dispatch)
        .await
        .unwrap();
    // A panic counts as a failure too (two runs, then failed).
    node.dispatch_job_with(
        "crashy",
        &b"panic"[..],
        &DispatchOptions::default().restart_policy(policy(100, 2)),
    )
    .await
    .unwrap();
    let failed = status_becomes(&node, "flaky", Duration::from_secs(10), |s| {
        matches!(s, Some(JobStatus::Failed { .. }))
    })
    .await;
    match failed {
        Some(JobStatus::Failed {
            failures,
            last_error,
            ..
        }) => {
            assert_eq!(failures, 4);
            assert!(last_error.contains("boom"), "{last_error}");
        }
        other => panic!("{other:?}"),
    }
    let runs = starts.of("flaky");
    assert_eq!(runs.len(), 4, "{runs:?}");
    let gaps: Vec<Duration> = runs.windows(2).map(|w| w[1].3 - w[0].3).collect();
    // Un-jittered delays 100, 200, 400 ms: jitter only stretches them.
    for (gap, floor) in gaps.iter().zip([100u64, 200, 400]) {
        assert!(*gap >= Duration::from_millis(floor), "gaps {gaps:?}");
    }
    assert!(gaps[2] > gaps[0], "gaps must grow: {gaps:?}");
    assert!(
        runs.windows(2).all(|w| w[1].2 > w[0].2),
        "tokens must increase: {runs:?}"
    );
    println!("restart gaps of a failing task: {gaps:?}");

    let crashy = status_becomes(&node, "crashy", Duration::from_secs(10), |s| {
        matches!(s, Some(JobStatus::Failed { .. }))
    })
    .await;
    assert!(
        matches!(&crashy, Some(JobStatus::Failed { failures: 2, last_error, .. }) if last_error.contains("kaboom")),
        "{crashy:?}"
    );
    assert_eq!(starts.of("crashy").len(), 2);

    // Failed for good: no more runs, and dispatching again starts it anew.
    assert_eq!(node.job_payload("flaky").await.unwrap(), None);
    node.dispatch_job("flaky", &b"run"[..]).await.unwrap();
    assert!(matches!(
        node.job_status("flaky").await.unwrap(),
        Some(JobStatus::Running { failures: 0, .. })
    ));
    assert_eq!(starts.of("flaky").len(), 5);
    // A stop ends a failed job's record too.
    node.stop_job("crashy").await.unwrap();
    assert_eq!(node.job_status("crashy").await.unwrap(), None);
    assert!(matches!(
        node.stop_job("crashy").await,
        Err(Error::JobNotFound(_))
    ));
    node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_the_backoff_stops_the_job_for_good() {
    let env = Env::new("life-stop");
    let node = env.node(fast()).await;
    let starts = Starts::default();
    let _w = worker(&node, "w0", &starts).await;
    let options = DispatchOptions::default().restart_policy(policy(400, 10));

    node.dispatch_job_with("k", &b"err"[..], &options)
        .await
        .unwrap();
    let restarting = status_becomes(&node, "k", Duration::from_secs(5), |s| {
        matches!(s, Some(JobStatus::Restarting { .. }))
    })
    .await;
    let Some(JobStatus::Restarting { restart_at, .. }) = restarting else {
        unreachable!()
    };
    // While it waits, the key is taken.
    assert!(matches!(
        node.dispatch_job("k", &b"err"[..]).await,
        Err(Error::JobExists(_))
    ));
    node.stop_job("k").await.unwrap();
    assert_eq!(node.job_status("k").await.unwrap(), None);
    // Past the restart's due time (Redis time, plus the longest jitter),
    // nothing ran again.
    let due = restart_at
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    tokio::time::sleep(due + Duration::from_millis(400)).await;
    assert_eq!(starts.of("k").len(), 1);
    assert_eq!(node.job_status("k").await.unwrap(), None);
    node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_dies_during_the_backoff_has_the_job_restarted_elsewhere_once() {
    let env = Env::new("life-kill");
    let proxy = FaultProxy::start(env.server.addr()).await.unwrap();
    let client = flotilla_testkit::client(&proxy.url()).await.unwrap();
    let doomed = Node::join(&client, &env.pool, fast()).await.unwrap();
    let starts = Starts::default();
    let victim = worker(&doomed, "doomed", &starts).await;
    let node = env.node(fast()).await;
    let _survivor = worker(&node, "survivor", &starts).await;
    // Long backoff: the victim dies while the job waits.
    let options = DispatchOptions::default().restart_policy(policy(3_000, 10));

    // A key the ring gives the doomed worker.
    let mut key = None;
    for i in 0..200 {
        let k = format!("job-{i}");
        if node.placement(&k).as_deref() == Some(victim.id()) {
            key = Some(k);
            break;
        }
    }
    let key = key.expect("some key lands on the doomed worker");
    node.dispatch_job_with(&key, &b"fail-on:doomed"[..], &options)
        .await
        .unwrap();
    let restarting = status_becomes(&node, &key, Duration::from_secs(5), |s| {
        matches!(s, Some(JobStatus::Restarting { .. }))
    })
    .await;
    let Some(JobStatus::Restarting { restart_at, .. }) = restarting else {
        unreachable!()
    };
    proxy.cut(); // the doomed process is gone for the pool
    let moved = status_becomes(
        &node,
        &key,
        Duration::from_secs(10),
        |s| matches!(s, Some(JobStatus::Running { worker, .. }) if worker != victim.id()),
    )
    .await;
    println!("after the victim's death: {moved:?}");
    // Past the victim's restart due time: the job ran once more, on the
    // survivor, never again on the victim.
    let due = restart_at
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    tokio::time::sleep(due + Duration::from_millis(500)).await;
    let runs = starts.of(&key);
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[0].1, "doomed");
    assert_eq!(runs[1].1, "survivor");
    assert!(runs[1].2 > runs[0].2);
    node.close().await.unwrap();
}
