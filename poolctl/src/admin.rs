//! Admin commands: they act on the pool through a client-only node, and
//! refuse to run without `--yes`.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use flotilla_pool::{Node, NodeOptions, WorkerRemoval};
use fred::prelude::Client;

use crate::cli::{Cli, Command};
use crate::commands::need_pool;
use crate::error::{CtlError, CtlResult};

/// Refuses an admin command that lacks `--yes`.
pub(crate) fn confirm(what: &str, yes: bool) -> CtlResult {
    if yes {
        Ok(())
    } else {
        Err(CtlError::Usage(format!(
            "refusing to {what} without --yes (admin commands change the pool)"
        )))
    }
}

/// Runs an admin command (after `confirm`).
pub(crate) async fn run(cli: &Cli, client: &Client) -> CtlResult {
    let pool = need_pool(cli)?;
    let (options, what) = match &cli.command {
        Command::Dispatch { timeout, .. } => (
            NodeOptions::default().dispatch_timeout(*timeout),
            "dispatch",
        ),
        Command::Shutdown { timeout, .. } => (
            NodeOptions::default().worker_shutdown_ttl(*timeout),
            "shutdown",
        ),
        // A dead worker is judged on this TTL (in Redis, on server time).
        Command::RemoveWorker { .. } => (
            NodeOptions::default().worker_ttl(cli.worker_ttl),
            "remove-worker",
        ),
        _ => (NodeOptions::default(), "admin"),
    };
    // Read the payload before joining, so a bad file changes nothing.
    let payload = match &cli.command {
        Command::Dispatch { payload_file, .. } | Command::Notify { payload_file, .. } => {
            read_payload(payload_file.as_deref())?
        }
        _ => Bytes::new(),
    };
    // A one-shot node: no replica of the jobs map (a large pool's would
    // cost more than the command); it asks Redis what it needs.
    let options = options.client_only(true).mirror_jobs(false);
    let node = Node::join(client, pool, options).await?;
    let result = match &cli.command {
        Command::Dispatch { key, .. } => match node.dispatch_job(key, payload).await {
            Ok(()) => Ok(format!(
                "dispatched {key:?}: running on {}",
                owner_text(&node, key).await
            )),
            Err(e) => Err(e),
        },
        Command::Stop { key, .. } => node
            .stop_job(key)
            .await
            .map(|()| format!("stopped {key:?}")),
        Command::Notify { key, .. } => node
            .notify_worker(key, payload)
            .await
            .map(|()| format!("notified the owner of {key:?}")),
        Command::Shutdown { .. } => node
            .shutdown()
            .await
            .map(|()| format!("pool {pool:?} shut down and its keys deleted")),
        Command::Drain { worker, .. } => node.drain_worker(worker).await.map(|changed| {
            if changed {
                format!("drained {worker:?}: no new job goes to it; its jobs move to other workers")
            } else {
                format!("{worker:?} was drained already")
            }
        }),
        Command::Undrain { worker, .. } => node.undrain_worker(worker).await.map(|changed| {
            if changed {
                format!("undrained {worker:?}: it takes its share of jobs again")
            } else {
                format!("{worker:?} was not drained")
            }
        }),
        Command::RemoveWorker { worker, .. } => node
            .remove_dead_worker(worker)
            .await
            .map(|removed| removal_text(worker, removed)),
        _ => Ok(format!("nothing to do for {what}")),
    };
    // `shutdown` closed the node already; closing again is a no-op.
    let closed = tokio::time::timeout(Duration::from_secs(10), node.close()).await;
    let message = result?;
    if let Ok(Err(e)) = closed {
        eprintln!("warning: leaving the pool failed: {e}");
    }
    println!("{message}");
    Ok(())
}

/// What a dead-worker removal did, in words.
pub(crate) fn removal_text(worker: &str, removal: WorkerRemoval) -> String {
    match removal {
        WorkerRemoval::Removed { silent } => format!(
            "removed {worker:?} (silent for {:.1}s): its jobs were requeued to live workers",
            silent.as_secs_f64()
        ),
        WorkerRemoval::InProgress => {
            format!("{worker:?} is being cleaned up by another node already")
        }
        WorkerRemoval::Recovering => format!(
            "{worker:?} was left alone: the pool is recovering from a Redis data loss or rollback; try again in a moment"
        ),
        _ => format!("{worker:?}: {removal:?}"),
    }
}

/// Where job `key` runs, as Redis records it ("its worker" when Redis
/// does not say).
pub(crate) async fn owner_text(node: &Node, key: &str) -> String {
    match node.lookup_job_owner(key).await {
        Ok(Some((w, t))) => format!("{w} (fencing token {t})"),
        _ => "its worker".to_string(),
    }
}

fn read_payload(path: Option<&Path>) -> CtlResult<Bytes> {
    match path {
        None => Ok(Bytes::new()),
        Some(p) => std::fs::read(p)
            .map(Bytes::from)
            .map_err(|source| CtlError::File {
                path: p.to_path_buf(),
                source,
            }),
    }
}
