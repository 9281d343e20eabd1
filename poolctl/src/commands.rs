//! The read-only commands: read with `flotilla_pool::inspect`, print a
//! table or JSON. None of them joins the pool or writes to Redis.

use flotilla_pool::inspect::{self, PoolSnapshot};
use fred::prelude::Client;
use serde::Serialize;

use crate::cli::{Cli, Command};
use crate::error::{CtlError, CtlResult};
use crate::format::hex;
use crate::render;
use crate::views::*;

/// Runs a read command.
pub(crate) async fn run(cli: &Cli, client: &Client) -> CtlResult {
    let ttl = cli.worker_ttl;
    match &cli.command {
        Command::Pools => pools(cli, client).await,
        Command::Locks => {
            let locks = inspect::locks(client, cli.pool.as_deref()).await?;
            let view = LocksView {
                pool: cli.pool.clone(),
                server_time_ms: inspect::server_time_ms(client).await?,
                locks: lock_views(&locks),
            };
            emit(cli.json, &view, |v| {
                render::locks(&v.locks, v.pool.as_deref())
            })
        }
        Command::Status => {
            let pool = need_pool(cli)?;
            let (snap, locks) = tokio::try_join!(read(client, pool), async {
                Ok(inspect::locks(client, Some(pool)).await?)
            })?;
            emit(cli.json, &status_view(&snap, &locks, ttl), render::status)
        }
        Command::Nodes => {
            let snap = read(client, need_pool(cli)?).await?;
            let view = NodesView {
                pool: snap.pool.clone(),
                server_time_ms: snap.server_time_ms,
                nodes: node_views(&snap),
            };
            emit(cli.json, &view, |v| render::nodes(&v.nodes))
        }
        Command::Workers => {
            let snap = read(client, need_pool(cli)?).await?;
            emit(cli.json, &workers_view(&snap, ttl), |v| {
                render::workers(&v.workers)
            })
        }
        Command::Jobs { worker, prefix } => {
            let snap = read(client, need_pool(cli)?).await?;
            let chosen: Vec<&inspect::JobRecord> = snap
                .jobs
                .iter()
                .filter(|j| worker.as_ref().is_none_or(|w| &j.owner == w))
                .filter(|j| {
                    prefix
                        .as_ref()
                        .is_none_or(|p| j.key.starts_with(p.as_str()))
                })
                .collect();
            let keys: Vec<String> = chosen.iter().map(|j| j.key.clone()).collect();
            let payloads = inspect::payload_summaries(client, &snap.pool, &keys).await?;
            let failures = inspect::job_failures(client, &snap.pool).await?;
            let failure_of = |key: &str| failures.iter().find(|f| f.key == key);
            let view = JobsView {
                pool: snap.pool.clone(),
                server_time_ms: snap.server_time_ms,
                jobs: chosen
                    .iter()
                    .zip(payloads)
                    .map(|(j, p)| job_view(&snap, j, p, failure_of(&j.key)))
                    .collect(),
                failed: failures
                    .iter()
                    .filter(|f| f.state == inspect::JobFailureState::Failed)
                    .filter(|f| snap.job(&f.key).is_none())
                    .filter(|f| {
                        prefix
                            .as_ref()
                            .is_none_or(|p| f.key.starts_with(p.as_str()))
                    })
                    .filter(|_| worker.is_none())
                    .map(|f| FailedJobView {
                        key: f.key.clone(),
                        failures: f.failures,
                        failed_at_ms: f.at_ms,
                        last_error: f.last_error.clone(),
                    })
                    .collect(),
            };
            emit(cli.json, &view, render::jobs)
        }
        Command::Job { key } => job(cli, client, key).await,
        Command::Pending => {
            let snap = read(client, need_pool(cli)?).await?;
            let view = PendingListView {
                pool: snap.pool.clone(),
                server_time_ms: snap.server_time_ms,
                pending: pending_views(&snap),
            };
            emit(cli.json, &view, |v| render::pending(&v.pending))
        }
        Command::Streams => {
            let pool = need_pool(cli)?;
            let (snap, streams) = tokio::try_join!(read(client, pool), async {
                Ok(inspect::streams(client, pool).await?)
            })?;
            let view = StreamsView {
                pool: pool.to_string(),
                streams: streams.into_iter().map(|s| stream_view(&snap, s)).collect(),
            };
            emit(cli.json, &view, render::streams)
        }
        Command::Placement { key } => {
            let snap = read(client, need_pool(cli)?).await?;
            emit(
                cli.json,
                &placement_view(&snap, key, ttl),
                render::placement,
            )
        }
        _ => Err(CtlError::Usage("not a read command".into())),
    }
}

/// The pool named by `--pool`.
pub(crate) fn need_pool(cli: &Cli) -> CtlResult<&str> {
    cli.pool.as_deref().ok_or_else(|| {
        CtlError::Usage("this command needs --pool NAME (see `poolctl pools`)".into())
    })
}

/// Reads a snapshot; warns on stderr when the pool has no state.
pub(crate) async fn read(client: &Client, pool: &str) -> CtlResult<PoolSnapshot> {
    let snap = PoolSnapshot::read(client, pool).await?;
    if snap.is_empty() {
        eprintln!(
            "note: pool {pool:?} has no nodes, workers or jobs in Redis (see `poolctl pools`)"
        );
    }
    Ok(snap)
}

/// Prints `view` as JSON or as `text` renders it.
fn emit<T: Serialize>(json: bool, view: &T, text: impl FnOnce(&T) -> String) -> CtlResult {
    if json {
        let out = serde_json::to_string_pretty(view)
            .map_err(|e| CtlError::Io(std::io::Error::other(e)))?;
        println!("{out}");
    } else {
        print!("{}", text(view));
    }
    Ok(())
}

async fn pools(cli: &Cli, client: &Client) -> CtlResult {
    let mut view = PoolsView { pools: Vec::new() };
    for p in inspect::list_pools(client).await? {
        let snap = PoolSnapshot::read(client, &p.name).await?;
        view.pools.push(PoolView {
            keys: p.keys,
            nodes: snap.nodes.len(),
            workers: snap.workers.len(),
            jobs: snap.jobs.len(),
            pending: snap.pending.len(),
            shutting_down: snap.shutdown_requested_by.is_some(),
            name: p.name,
        });
    }
    emit(cli.json, &view, render::pools)
}

async fn job(cli: &Cli, client: &Client, key: &str) -> CtlResult {
    let pool = need_pool(cli)?;
    let (snap, payload, failure) = tokio::try_join!(
        PoolSnapshot::read(client, pool),
        inspect::job_payload(client, pool, key),
        inspect::job_failure(client, pool, key)
    )?;
    let running = snap.job(key);
    let pending = pending_views(&snap).into_iter().find(|p| p.key == key);
    // A failure record counts only for the run it names, or once the job
    // failed for good (no run left).
    let failure = failure.filter(|f| match running {
        Some(j) => f.token == j.token,
        None => pending.is_none() && f.state == inspect::JobFailureState::Failed,
    });
    let state = match (running, &pending, &payload, &failure) {
        (Some(_), _, _, Some(f)) if f.state == inspect::JobFailureState::Restarting => "restarting",
        (Some(_), _, _, _) => "running",
        (None, Some(_), _, _) => "pending",
        (None, None, _, Some(_)) => "failed",
        (None, None, Some(_), None) => "orphaned",
        (None, None, None, None) => {
            return Err(CtlError::NotFound(format!(
                "job {key:?} not found in pool {pool:?}"
            )));
        }
    };
    let bytes: &[u8] = payload.as_ref().map_or(&[], |p| &p.payload);
    let utf8 = std::str::from_utf8(bytes).is_ok();
    let view = JobDetailView {
        pool: pool.to_string(),
        key: key.to_string(),
        state,
        failures: failure.as_ref().map(|f| f.failures),
        last_error: failure.as_ref().map(|f| f.last_error.clone()),
        failure_at_ms: failure.as_ref().map(|f| f.at_ms),
        owner: running.map(|j| j.owner.clone()),
        token: running
            .map(|j| j.token)
            .or(pending.as_ref().map(|p| p.token)),
        created_at_ms: payload.as_ref().map(|p| p.created_at_ms),
        age_ms: payload
            .as_ref()
            .map(|p| snap.server_time_ms.saturating_sub(p.created_at_ms)),
        payload_size: payload.as_ref().map(|p| p.payload.len()),
        payload_hex: payload.as_ref().map(|p| hex(&p.payload)),
        payload_utf8: payload
            .as_ref()
            .map(|p| String::from_utf8_lossy(&p.payload).into_owned()),
        payload_is_utf8: payload.as_ref().map(|_| utf8),
        pending,
    };
    emit(cli.json, &view, |v| render::job(v, bytes))
}
