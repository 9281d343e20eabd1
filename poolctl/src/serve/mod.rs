//! `poolctl serve`: a web dashboard of one pool.
//!
//! Pages are rendered on the server (maud) from the same data the JSON API
//! under `/api/…` returns; a little vanilla JS polls the API to refresh
//! the overview and the charts without reloading the page. Reads go
//! through `flotilla_pool::inspect` and `flotilla_pool::history` (read
//! commands only); admin actions join the pool as a client-only node for
//! the duration of the action and need `--admin-token` (see `actions.rs`).
//! Redis going away is shown, not fatal: the client reconnects forever and
//! the pages say "Redis unreachable" meanwhile.

mod actions;
mod api;
mod cache;
mod charts;
mod history;
mod jobs;
mod metrics;
mod pages;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use fred::prelude::{Client, ClientLike};

use crate::cli::Cli;
use crate::error::{CtlError, CtlResult};

/// What `serve` was asked for.
#[derive(Debug, Clone)]
pub(crate) struct ServeOptions {
    pub(crate) listen: SocketAddr,
    pub(crate) admin_token: Option<String>,
    pub(crate) worker_ttl: Duration,
}

/// State shared by every request.
#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) client: Client,
    pub(crate) pool: String,
    pub(crate) worker_ttl: Duration,
    admin_token: Option<String>,
    pub(crate) cache: Arc<cache::SnapshotCache>,
    pub(crate) history: history::HistoryCache,
    /// Dispatch timeout of admin actions.
    pub(crate) action_timeout: Duration,
}

/// Shared state handle.
pub(crate) type Shared = Arc<AppState>;

/// Runs the dashboard until Ctrl-C (or SIGTERM).
///
/// # Errors
/// [`CtlError::Usage`] for a bad URL, [`CtlError::Io`] when the address
/// cannot be bound.
pub(crate) async fn run(cli: &Cli, pool: &str, options: ServeOptions) -> CtlResult {
    let client = crate::connect::lasting_client(&cli.redis, cli.tls_ca.as_deref())?;
    let connection = client.connect();
    let state = Arc::new(AppState {
        cache: Arc::new(cache::SnapshotCache::new(client.clone(), pool.to_string())),
        history: history::HistoryCache::new(client.clone(), pool.to_string()),
        client: client.clone(),
        pool: pool.to_string(),
        worker_ttl: options.worker_ttl,
        admin_token: options.admin_token.filter(|t| !t.is_empty()),
        action_timeout: Duration::from_secs(10),
    });
    let listener = tokio::net::TcpListener::bind(options.listen).await?;
    let local = listener.local_addr()?;
    // Tests and scripts read this line to learn the port of `:0`.
    println!("listening on http://{local}");
    eprintln!(
        "poolctl serve: pool {pool:?} on {}, {}",
        crate::connect::redact(&cli.redis),
        if state.admin_token.is_some() {
            "admin actions enabled (bearer token)"
        } else {
            "read-only (no --admin-token)"
        }
    );
    let app = router(state.clone());
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await;
    state.cache.close().await;
    let _ = client.quit().await;
    connection.abort();
    served.map_err(CtlError::Io)
}

/// Every route.
pub(crate) fn router(state: Shared) -> Router {
    Router::new()
        .route("/", get(pages::overview))
        .route("/jobs", get(pages::jobs))
        .route("/jobs/{key}", get(pages::job))
        .route("/history", get(pages::history))
        .route("/static/app.js", get(pages::app_js))
        .route("/static/app.css", get(pages::app_css))
        .route("/metrics", get(metrics::metrics))
        .route("/api/overview", get(api::overview))
        .route("/api/jobs", get(api::jobs))
        .route("/api/jobs/{key}", get(api::job))
        .route("/api/history", get(api::history))
        .route("/api/jobs/{key}/stop", post(actions::stop))
        .route("/api/jobs/{key}/dispatch", post(actions::dispatch))
        .route("/api/jobs/{key}/requeue", post(actions::requeue))
        .route("/api/workers/{id}/drain", post(actions::drain))
        .route("/api/workers/{id}/undrain", post(actions::undrain))
        .route("/api/workers/{id}/remove", post(actions::remove))
        .fallback(api::not_found)
        .with_state(state)
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Percent-encodes a job key or worker id for a URL path segment.
pub(crate) fn path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(path_segment("job-a_1.x"), "job-a_1.x");
        assert_eq!(path_segment("a/b c?"), "a%2Fb%20c%3F");
        assert_eq!(path_segment("é"), "%C3%A9");
    }
}
