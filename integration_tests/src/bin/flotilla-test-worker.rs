//! A worker process for Flotilla's process-level tests.
//!
//! Joins a pool, runs `--workers` workers whose handler records every start
//! and stop in an append-only JSON-lines ledger (one write per event), also
//! records its view of the ring when it changes and each lease loss, prints
//! `READY ["<worker id>", ...]` once its workers are registered, and runs
//! until killed. On `SIGTERM` or `SIGINT` it closes its node (handing its
//! jobs to other workers) and exits.
//!
//! ```text
//! flotilla-test-worker --redis redis://127.0.0.1:6379 --pool p --ttl-ms 2000 --workers 2 --ledger w1.jsonl
//! ```

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use backon::Retryable;
use bytes::Bytes;
use clap::Parser;
use flotilla_integration_tests::clock::ServerClock;
use flotilla_integration_tests::ledger::{LedgerWriter, Record};
use flotilla_integration_tests::lifecycle::{self, FINISHED_TARGET, FinishedLayer, RunTimers};
use flotilla_integration_tests::process::READY_PREFIX;
use flotilla_integration_tests::requests::{self, Op, Outcome};
use flotilla_integration_tests::schedules::{ScheduleSpec, ScheduledLoad};
use flotilla_integration_tests::windows;
use flotilla_pool::{Handler, HandlerError, Job, Node, NodeOptions, Worker};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Command line.
#[derive(Debug, Parser)]
#[command(about = "A Flotilla worker process that records its jobs in a ledger")]
struct Args {
    /// Redis URL.
    #[arg(long)]
    redis: String,
    /// Pool name.
    #[arg(long)]
    pool: String,
    /// Worker TTL in milliseconds.
    #[arg(long, default_value_t = 2000)]
    ttl_ms: u64,
    /// Number of workers in this process.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Ledger file (appended to).
    #[arg(long)]
    ledger: PathBuf,
    /// Shortest time a handler `stop` takes (ms); the stop line is written
    /// when it returns.
    #[arg(long, default_value_t = 0)]
    stop_min_ms: u64,
    /// Longest time a handler `stop` takes (ms).
    #[arg(long, default_value_t = 0)]
    stop_max_ms: u64,
    /// Do not mirror the pool's jobs and pending maps
    /// (`NodeOptions::mirror_jobs(false)`). Without it the node mirrors
    /// them (`mirror_jobs(true)`, set explicitly).
    #[arg(long)]
    no_job_replicas: bool,
    /// Some keys' runs end on their own: 1 in 8 fail after a while (the
    /// pool restarts them), 1 in 8 finish (see
    /// `flotilla_integration_tests::lifecycle`).
    #[arg(long)]
    lifecycle: bool,
    /// A fixed node id (`NodeOptions::node_id`), e.g. one a process that
    /// ended had: the node comes back under it.
    #[arg(long)]
    node_id: Option<String>,
    /// Longest time a handler `start` takes after it wrote its start line
    /// (ms; each a random time up to it). 0: it returns at once.
    #[arg(long, default_value_t = 0)]
    start_max_ms: u64,
    /// Lanes per worker (`NodeOptions::worker_lanes`); 0: the library's
    /// default.
    #[arg(long, default_value_t = 0)]
    worker_lanes: usize,
    /// Take dispatches and stops on stdin and answer them on stdout, once
    /// ready (see `flotilla_integration_tests::requests`): the node that
    /// calls is this process's own, which holds jobs and meets the faults.
    #[arg(long)]
    requests: bool,
    /// Run the chaos schedule over this many keys (see
    /// `flotilla_integration_tests::schedules`); 0: no schedule.
    #[arg(long, default_value_t = 0)]
    schedule_keys: usize,
    /// The schedule's interval (ms).
    #[arg(long, default_value_t = 1000)]
    schedule_interval_ms: u64,
    /// How often the schedule's unwanted keys change (ms).
    #[arg(long, default_value_t = 6000)]
    schedule_rotate_ms: u64,
    /// Wall-clock time (ms since the UNIX epoch) after which they stop
    /// changing.
    #[arg(long, default_value_t = 0)]
    schedule_rotate_until_ms: u64,
    /// The schedule's leader lease TTL (ms).
    #[arg(long, default_value_t = 2000)]
    schedule_leader_ttl_ms: u64,
}

impl Args {
    /// The schedule to run, if any.
    fn schedule(&self) -> Option<ScheduleSpec> {
        (self.schedule_keys > 0).then(|| ScheduleSpec {
            keys: self.schedule_keys,
            interval: Duration::from_millis(self.schedule_interval_ms),
            rotate: Duration::from_millis(self.schedule_rotate_ms),
            rotate_until_ms: self.schedule_rotate_until_ms,
            leader_ttl: Duration::from_millis(self.schedule_leader_ttl_ms),
        })
    }
}

/// Records starts and stops; runs nothing else (a job "runs" between them).
#[derive(Debug)]
struct LedgerHandler {
    /// The worker's id, known once `Worker::new` returned; the worker may
    /// get its first job just before, so handlers wait for it.
    worker: watch::Receiver<Option<String>>,
    ledger: LedgerWriter,
    /// Range of `stop` durations in ms.
    stop_ms: (u64, u64),
    /// Longest `start` duration in ms, after the start line.
    start_max_ms: u64,
    /// Runs that end on their own (`--lifecycle`), else `None`.
    lifecycle: Option<RunTimers>,
}

impl LedgerHandler {
    async fn worker_id(&self) -> String {
        let mut rx = self.worker.clone();
        match rx.wait_for(Option::is_some).await {
            Ok(id) => id.clone().unwrap_or_default(),
            Err(_) => String::new(),
        }
    }
}

/// Writes a job's `stop` line when dropped: at the end of its stop, or
/// when the pool drops the stop for overrunning its budget.
struct StopLine<'a> {
    ledger: &'a LedgerWriter,
    key: &'a str,
    worker: String,
}

impl Drop for StopLine<'_> {
    fn drop(&mut self) {
        self.ledger.record(Record::Stop {
            key: self.key.to_string(),
            worker: std::mem::take(&mut self.worker),
        });
    }
}

#[async_trait]
impl Handler for LedgerHandler {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        let worker = self.worker_id().await;
        let admitted_ms = job
            .created_at
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_millis() as u64);
        self.ledger.record(Record::Start {
            key: job.key.clone(),
            token: job.fencing_token,
            worker: worker.clone(),
            admitted_ms,
        });
        if let Some(runs) = &self.lifecycle {
            runs.begin(&job, &worker, &self.ledger);
        }
        if self.start_max_ms > 0 {
            let ms = rand::Rng::random_range(&mut rand::rng(), 0..=self.start_max_ms);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        Ok(())
    }

    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        if self.lifecycle.as_ref().is_some_and(|runs| runs.end(key)) {
            // The run ended on its own (its `ended` line is written): the
            // pool stops what is left of it, which is nothing.
            return Ok(());
        }
        // Written once the job has stopped: the checker's run ends here. A
        // stop past its budget is given up on by the pool, which drops this
        // future (and logs an error): the run ends then too, as nothing of
        // it goes on after the drop.
        let _stopped = StopLine {
            ledger: &self.ledger,
            key,
            worker: self.worker_id().await,
        };
        let (min, max) = self.stop_ms;
        if max > 0 {
            let ms = rand::Rng::random_range(&mut rand::rng(), min..=max.max(min));
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        Ok(())
    }

    async fn notify(&self, _key: &str, _payload: Bytes) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// A metrics recorder that turns the pool's lease-loss counter into ledger
/// lines, so the checker knows when this process stopped its jobs on its
/// own. It must be installed before the node exists: the node registers
/// its counters when it is made, and a counter registered while no
/// recorder is installed stays a no-op. The ledger needs the server clock,
/// read through the node's client behind Sentinel, so it is set later (a
/// lease can only be lost once workers run, after that).
#[derive(Debug)]
struct LeaseLossRecorder {
    ledger: Arc<OnceLock<LedgerWriter>>,
}

#[derive(Debug)]
struct LeaseLossCounter {
    ledger: Arc<OnceLock<LedgerWriter>>,
}

impl metrics::CounterFn for LeaseLossCounter {
    fn increment(&self, _value: u64) {
        match self.ledger.get() {
            Some(ledger) => {
                ledger.record(Record::LeaseLost);
            }
            None => eprintln!("flotilla-test-worker: lease lost before the ledger opened"),
        }
    }
    fn absolute(&self, _value: u64) {}
}

impl metrics::Recorder for LeaseLossRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        if key.name() == "flotilla_pool_lease_lost_total" {
            metrics::Counter::from_arc(Arc::new(LeaseLossCounter {
                ledger: self.ledger.clone(),
            }))
        } else {
            metrics::Counter::noop()
        }
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // The log as RUST_LOG asks, and, whatever it asks, the pool's `job
    // finished` events into the ledger.
    let finished = FinishedLayer::default();
    let finished_ledger = finished.ledger();
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
                ),
        )
        .with(
            finished.with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target(FINISHED_TARGET, tracing::Level::INFO),
            ),
        )
        .init();
    match run(args, finished_ledger).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flotilla-test-worker: {e}");
            ExitCode::FAILURE
        }
    }
}

/// How long a process started during a failover keeps trying to join, as a
/// supervisor restarting it would (the harness waits 30 s for `READY`).
const JOIN_WINDOW: Duration = Duration::from_secs(25);

/// `Node::connect` through Sentinel, tried again while the Sentinels name
/// no server that answers as primary, or the primary refuses writes (too
/// few replicas for `min-replicas-to-write`): each attempt waits its own
/// `redis_timeout`, and a Sentinel that still names a demoted primary after
/// a failover fails every attempt that asks it until it learns the new one.
async fn connect_through_sentinel(
    args: &Args,
    options: &NodeOptions,
) -> Result<Node, flotilla_pool::Error> {
    let started = tokio::time::Instant::now();
    loop {
        match Node::connect(&args.redis, &args.pool, options.clone()).await {
            Ok(node) => return Ok(node),
            // A primary refuses writes while it has too few replicas
            // (`min-replicas-to-write`), e.g. one restarting after a
            // failover: joining again is what a supervisor would do.
            Err(
                e @ (flotilla_pool::Error::Unavailable(_) | flotilla_pool::Error::WritesRefused(_)),
            ) if started.elapsed() < JOIN_WINDOW => {
                eprintln!("flotilla-test-worker: joining again after: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn run(
    args: Args,
    finished_ledger: Arc<OnceLock<LedgerWriter>>,
) -> Result<(), Box<dyn std::error::Error>> {
    let ttl = Duration::from_millis(args.ttl_ms);
    let lease_loss_ledger = Arc::new(OnceLock::new());
    if metrics::set_global_recorder(LeaseLossRecorder {
        ledger: lease_loss_ledger.clone(),
    })
    .is_err()
    {
        return Err("a metrics recorder was installed already".into());
    }
    let options = NodeOptions::default()
        .worker_ttl(ttl)
        .ack_grace(ttl)
        .dispatch_timeout(Duration::from_secs(5))
        .mirror_jobs(!args.no_job_replicas)
        .restart_policy(lifecycle::restart_policy());
    let options = match args.worker_lanes {
        0 => options,
        lanes => options.worker_lanes(lanes),
    };
    let options = match &args.node_id {
        Some(id) => options.node_id(id),
        None => options,
    };
    // Behind Sentinel the node connects by URL (and follows failovers);
    // otherwise through the test client, which trusts a private TLS server.
    // The harness may start this process while a Redis it just restarted
    // loads its data (`add` right after a restart): it answers LOADING for
    // a moment, which is no reason to fail the start.
    let connected = if args.redis.contains("-sentinel://") {
        Some(connect_through_sentinel(&args, &options).await?)
    } else {
        None
    };
    let client = match &connected {
        Some(node) => node.client().clone(),
        // The test client's settings, with the reconnect pauses the
        // library advises for the worker TTL.
        None => {
            let mut builder = flotilla_testkit::builder(&args.redis)?;
            builder.set_policy(flotilla_pool::reconnect_policy(&options));
            let connect = || async {
                let client = builder.build()?;
                flotilla_pool::fred::prelude::ClientLike::init(&client).await?;
                Ok::<_, flotilla_pool::fred::error::Error>(client)
            };
            connect
                .retry(while_loading())
                .when(|e| loading(&e.to_string()))
                .await?
        }
    };
    let clock = ServerClock::new();
    // As for connecting: a server loading its data answers LOADING.
    (|| clock.sample(&client, true))
        .retry(while_loading())
        .when(|e| loading(&e.to_string()))
        .await?;
    let cancel = CancellationToken::new();
    tokio::spawn(
        clock
            .clone()
            .run(client.clone(), Duration::from_millis(500), cancel.clone()),
    );
    let ledger = LedgerWriter::open(&args.ledger, clock)?;
    let _ = lease_loss_ledger.set(ledger.clone());
    let _ = finished_ledger.set(ledger.clone());
    let node = match connected {
        Some(node) => node,
        None => {
            (|| Node::join(&client, &args.pool, options.clone()))
                .retry(while_loading())
                .when(|e| loading(&e.to_string()))
                .await?
        }
    };
    let mut workers = Vec::new();
    let mut id_senders = Vec::new();
    for _ in 0..args.workers {
        let (id_tx, id_rx) = watch::channel(None);
        let worker = Worker::new(
            &node,
            LedgerHandler {
                worker: id_rx,
                ledger: ledger.clone(),
                stop_ms: (args.stop_min_ms, args.stop_max_ms),
                start_max_ms: args.start_max_ms,
                lifecycle: args.lifecycle.then(RunTimers::default),
            },
        )
        .await?;
        id_tx.send_replace(Some(worker.id().to_string()));
        id_senders.push(id_tx);
        workers.push(worker);
    }
    let ids: Vec<String> = workers.iter().map(|w| w.id().to_string()).collect();
    ledger.record(Record::Ready {
        workers: ids.clone(),
    });
    tokio::spawn(watch_ring(node.clone(), ledger.clone(), cancel.clone()));
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{READY_PREFIX}{}", serde_json::to_string(&ids)?)?;
        out.flush()?;
    }
    if args.requests {
        tokio::spawn(serve_requests(node.clone(), cancel.clone()));
    }
    let scheduled = match args.schedule() {
        Some(spec) => Some(ScheduledLoad::start(&node, ledger.clone(), spec).await?),
        None => None,
    };
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    cancel.cancel();
    if let Some(scheduled) = scheduled {
        scheduled.close().await;
    }
    node.close().await?;
    Ok(())
}

/// Carries out the driver's requests (stdin lines) on `node`, each in a
/// task of its own so a slow one holds no other back, and prints each
/// reply line on stdout; until stdin ends or `cancel`.
async fn serve_requests(node: Node, cancel: CancellationToken) {
    let (replies_tx, mut replies) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        let mut out = tokio::io::stdout();
        while let Some(line) = replies.recv().await {
            let written = async {
                out.write_all(line.as_bytes()).await?;
                out.flush().await
            };
            if written.await.is_err() {
                return;
            }
        }
    });
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    loop {
        let line = tokio::select! {
            _ = cancel.cancelled() => return,
            line = lines.next_line() => match line {
                Ok(Some(line)) => line,
                _ => return,
            },
        };
        let Some((id, op)) = requests::parse_request(&line) else {
            eprintln!("flotilla-test-worker: not a request: {line:?}");
            continue;
        };
        let node = node.clone();
        let replies = replies_tx.clone();
        tokio::spawn(async move {
            let result = match &op {
                Op::Dispatch {
                    key,
                    fail_for_good,
                    window_ms,
                } => {
                    let options = windows::dispatch_options(*fail_for_good, *window_ms);
                    node.dispatch_job_with(key, &b"chaos"[..], &options).await
                }
                Op::Stop { key } => node.stop_job(key).await,
            };
            let outcome = Outcome::of(&result, node.id());
            let _ = replies.send(format!("{}\n", requests::reply_line(id, &outcome)));
        });
    }
}

/// Records the pool's active workers (the ring) as this process sees them,
/// whenever that view changes.
async fn watch_ring(node: Node, ledger: LedgerWriter, cancel: CancellationToken) {
    let mut last: Option<Vec<String>> = None;
    loop {
        let mut active: Vec<String> = node
            .pool_workers()
            .into_iter()
            .filter(|w| !w.cleaning && !w.drained)
            .map(|w| w.id)
            .collect();
        active.sort();
        if last.as_ref() != Some(&active) {
            ledger.record(Record::Ring {
                workers: active.clone(),
            });
            last = Some(active);
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
}

/// Retries of a start-up call while Redis is loading its data: up to 10 s.
fn while_loading() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(10))
        .with_max_delay(Duration::from_millis(200))
        .without_max_times()
        .with_total_delay(Some(Duration::from_secs(10)))
}

/// Whether an error is Redis's answer while it loads its data.
fn loading(error: &str) -> bool {
    error.contains("LOADING")
}
