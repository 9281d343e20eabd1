#![doc = include_str!("../../MULTIHOME.md")]

mod breaker;
mod capacity;
pub(crate) mod config;
mod home;
mod home_handler;
mod options;
mod state;
mod supervisor;

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use breaker::BreakerState;
pub use config::{ConfigError, HomeConfig, MultiHomeConfig, POOLS_VAR, REDIS_URLS_VAR};
pub use home_handler::{home_job_key, split_home_job_key};
pub use options::MultiHomeOptions;
pub use state::{PublishedHome, PublishedState, read_published};

use crate::error::{Error, Result};
use crate::handler::Handler;
use crate::node::Node;
use crate::worker::Worker;
use home::Home;
use supervisor::Shared;

/// One handler serving pools on several Redis deployments.
///
/// Start with [`MultiHomeWorker::start`]; call [`close`](Self::close)
/// before the process exits so that every home hands its jobs over at
/// once.
pub struct MultiHomeWorker {
    shared: Arc<Shared>,
    tasks: TaskTracker,
    cancel: CancellationToken,
}

/// A home as the worker sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HomeStatus {
    /// The home's name (prefix of the job keys its handler sees).
    pub name: String,
    /// The pool served there.
    pub pool: String,
    /// The Redis URL, password masked.
    pub url: String,
    /// The breaker's state.
    pub state: BreakerState,
    /// Consecutive failed operations.
    pub consecutive_failures: u32,
    /// How often the breaker opened.
    pub opens: u64,
    /// Whether the home's node and worker are up (a home unreachable at
    /// start joins later, from its supervisor).
    pub joined: bool,
    /// Its share of capacity (`None`: no limit).
    pub allotted: Option<usize>,
    /// Jobs of this home running on the worker.
    pub running: usize,
}

impl std::fmt::Debug for MultiHomeWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiHomeWorker")
            .field("id", &self.shared.id)
            .field("homes", &self.homes())
            .finish()
    }
}

impl MultiHomeWorker {
    /// Joins every home's pool and starts a worker there running `handler`.
    ///
    /// Homes are joined concurrently, each within three poll timeouts. With
    /// several homes, a home that cannot be joined does not fail the start
    /// (unless none can): its supervisor keeps trying, through its breaker.
    /// With one home, any failure is returned.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`], [`Error::HomeConfig`] (a URL that fred
    /// cannot use), and the first home's join error when no home joined.
    pub async fn start(
        config: MultiHomeConfig,
        options: MultiHomeOptions,
        handler: impl Handler,
    ) -> Result<MultiHomeWorker> {
        options.validate()?;
        let names = config.home_names();
        let mut homes = Vec::with_capacity(names.len());
        for (index, name) in names.into_iter().enumerate() {
            let home = &config.homes()[index];
            homes.push(Home::new(
                name,
                home.pool.clone(),
                config::redact(&home.url),
                config.fred_config(index)?,
                &options,
            ));
        }
        if let Some(total) = options.max_concurrent_jobs {
            // Until the first re-split: as if every home were healthy.
            let shares = capacity::split(total, &vec![true; homes.len()]);
            for (home, share) in homes.iter().zip(shares) {
                home.shared.slots.set_allotted(Some(share));
            }
        }
        for home in &homes {
            metrics::gauge!("flotilla_multihome_breaker_state", "home" => home.name().to_string())
                .set(BreakerState::Closed.gauge());
        }
        let id = format!("mh-{}", uuid::Uuid::new_v4().simple());
        let handler: Arc<dyn Handler> = Arc::new(handler);
        let shared = Arc::new(Shared::new(id, options, homes, handler));
        let joins = shared
            .homes
            .iter()
            .map(|home| home.join(&shared.handler, &shared.options));
        let results = futures::future::join_all(joins).await;
        let worker = MultiHomeWorker {
            shared: shared.clone(),
            tasks: TaskTracker::new(),
            cancel: CancellationToken::new(),
        };
        if results.iter().all(Result::is_err) {
            let _ = worker.close().await;
            let first = results.into_iter().find_map(Result::err);
            return Err(first.unwrap_or(Error::Closed));
        }
        if shared.homes.len() == 1 {
            // The plain path: no supervisor, the whole capacity on one home.
            return Ok(worker);
        }
        for (home, result) in shared.homes.iter().zip(&results) {
            if let Err(e) = result {
                tracing::warn!(home = %home.name(), url = %home.url, error = %e, "home not joined at start; its supervisor retries");
                if let Some(t) = home.breaker().on_failure(tokio::time::Instant::now()) {
                    shared.on_transition(home, t);
                }
            }
        }
        shared.resplit();
        for index in 0..shared.homes.len() {
            let me = shared.clone();
            let cancel = worker.cancel.clone();
            worker.tasks.spawn(me.supervise(index, cancel));
        }
        tracing::info!(worker = %shared.id, homes = shared.homes.len(), "multi-home worker started");
        Ok(worker)
    }

    /// The worker's id (names its published state in every home).
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// Every home, in configuration order.
    pub fn homes(&self) -> Vec<HomeStatus> {
        self.shared.homes.iter().map(status).collect()
    }

    /// One home by name.
    pub fn home(&self, name: &str) -> Option<HomeStatus> {
        self.find(name).map(status)
    }

    /// The node of home `name`, once joined (dispatch, inspect, ...).
    pub fn node(&self, name: &str) -> Option<Node> {
        Some(self.find(name)?.joined.load_full()?.node.clone())
    }

    /// The worker of home `name`, once joined.
    pub fn worker(&self, name: &str) -> Option<Worker> {
        Some(self.find(name)?.joined.load_full()?.worker.clone())
    }

    /// A receiver of the breaker state of home `name`.
    pub fn breaker_state(&self, name: &str) -> Option<watch::Receiver<BreakerState>> {
        Some(self.find(name)?.state.subscribe())
    }

    /// Number of background tasks this worker added to those of its nodes:
    /// one supervisor per home with several homes, none with one.
    pub fn background_tasks(&self) -> usize {
        self.tasks.len()
    }

    /// Stops the supervisors and closes every home concurrently (each
    /// node hands its jobs to other workers of its pool), each within its
    /// node's shutdown TTL plus the poll timeout. Idempotent.
    ///
    /// # Errors
    /// The first home's close error (the others are closed anyway).
    pub async fn close(&self) -> Result<()> {
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        let closes = self.shared.homes.iter().map(|home| {
            let key = self.shared.state_key(home);
            async move { home.close(&self.shared.options, &key).await }
        });
        let results = futures::future::join_all(closes).await;
        tracing::info!(worker = %self.shared.id, "multi-home worker closed");
        results.into_iter().find(Result::is_err).unwrap_or(Ok(()))
    }

    fn find(&self, name: &str) -> Option<&Home> {
        self.shared.homes.iter().find(|h| h.name() == name)
    }
}

impl Drop for MultiHomeWorker {
    /// Stops the supervisors. The homes' nodes are closed only by
    /// [`close`](MultiHomeWorker::close); without it their jobs move after
    /// the worker TTL, as with a dropped [`Node`].
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

fn status(home: &Home) -> HomeStatus {
    let (state, consecutive_failures, opens) = {
        let b = home.breaker();
        (b.state(), b.consecutive_failures(), b.opens())
    };
    HomeStatus {
        name: home.name().to_string(),
        pool: home.pool.clone(),
        url: home.url.clone(),
        state,
        consecutive_failures,
        opens,
        joined: home.joined.load().is_some(),
        allotted: home.shared.slots.allotted(),
        running: home.shared.slots.running(),
    }
}
