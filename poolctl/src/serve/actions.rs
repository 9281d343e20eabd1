//! Admin actions (`POST /api/…`): only with `--admin-token`, sent as
//! `Authorization: Bearer <token>`.
//!
//! * no token configured: 403 (the dashboard is read-only);
//! * no or malformed `Authorization` header: 401 with
//!   `WWW-Authenticate: Bearer`;
//! * a wrong token: 403.
//!
//! CSRF-safe by construction: the dashboard sets no cookie and accepts no
//! credential a browser would attach by itself, and a cross-site page
//! cannot add an `Authorization` header without a CORS preflight, which
//! this server never grants. Each action joins the pool as a client-only
//! node for its duration (as the CLI's admin commands do) and leaves.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use flotilla_pool::{Node, NodeOptions, inspect};
use serde::Serialize;

use super::Shared;
use super::api::ApiError;

/// The answer of a successful action.
#[derive(Debug, Serialize)]
pub(crate) struct ActionDone {
    pub(crate) ok: bool,
    pub(crate) action: &'static str,
    pub(crate) key: String,
    pub(crate) message: String,
}

/// Why an admin request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The dashboard runs without `--admin-token` (403).
    ReadOnly,
    /// No `Authorization` header (401).
    Missing,
    /// An `Authorization` header that is not `Bearer …` (401).
    NotBearer,
    /// A bearer token that is not the admin token (403).
    WrongToken,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            Refusal::ReadOnly => (
                StatusCode::FORBIDDEN,
                "read-only dashboard: admin actions need poolctl serve --admin-token",
            ),
            Refusal::Missing => (
                StatusCode::UNAUTHORIZED,
                "admin action: send Authorization: Bearer <token>",
            ),
            Refusal::NotBearer => (
                StatusCode::UNAUTHORIZED,
                "Authorization must be: Bearer <token>",
            ),
            Refusal::WrongToken => (StatusCode::FORBIDDEN, "wrong admin token"),
        };
        let mut response = ApiError::new(status, message).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"poolctl\""),
            );
        }
        response
    }
}

/// Checks the bearer token of an admin request.
fn authorize(state: &Shared, headers: &HeaderMap) -> Result<(), Refusal> {
    let expected = state.admin_token.as_deref().ok_or(Refusal::ReadOnly)?;
    let value = headers.get(header::AUTHORIZATION).ok_or(Refusal::Missing)?;
    let given = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or(Refusal::NotBearer)?;
    if same(given.as_bytes(), expected.as_bytes()) {
        Ok(())
    } else {
        Err(Refusal::WrongToken)
    }
}

/// Compares in time independent of where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Joins the pool as a client-only node, runs `act`, leaves.
async fn with_node<F, Fut>(state: &Shared, act: F) -> Result<String, ApiError>
where
    F: FnOnce(Node) -> Fut,
    Fut: std::future::Future<Output = Result<String, ApiError>>,
{
    let options = NodeOptions::default()
        .client_only(true)
        .worker_ttl(state.worker_ttl)
        .dispatch_timeout(state.action_timeout);
    let node = Node::join(&state.client, &state.pool, options).await?;
    let result = act(node.clone()).await;
    if let Err(e) = node.close().await {
        tracing::warn!(error = %e, "leaving the pool after an action failed");
    }
    result
}

fn done(action: &'static str, key: String, message: String) -> Response {
    tracing::info!(action, key, "admin action done");
    Json(ActionDone {
        ok: true,
        action,
        key,
        message,
    })
    .into_response()
}

/// `POST /api/jobs/{key}/stop`: stops a running job.
pub(crate) async fn stop(
    State(state): State<Shared>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = authorize(&state, &headers) {
        return refused.into_response();
    }
    let k = key.clone();
    match with_node(&state, |node| async move {
        node.stop_job(&k).await?;
        Ok(format!("stopped {k:?}"))
    })
    .await
    {
        Ok(message) => done("stop", key, message),
        Err(e) => e.into_response(),
    }
}

/// `POST /api/jobs/{key}/dispatch` (body: the payload bytes): starts a job
/// and answers once a worker runs it.
pub(crate) async fn dispatch(
    State(state): State<Shared>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(refused) = authorize(&state, &headers) {
        return refused.into_response();
    }
    let k = key.clone();
    match with_node(&state, |node| async move {
        node.dispatch_job(&k, body).await?;
        Ok(format!("dispatched {k:?}: running on {}", owner(&node, &k)))
    })
    .await
    {
        Ok(message) => done("dispatch", key, message),
        Err(e) => e.into_response(),
    }
}

/// `POST /api/jobs/{key}/requeue`: stops the job (when it runs) and
/// dispatches it again with its stored payload, so it starts afresh (new
/// fencing token) on the worker its key belongs to. Two steps, not one
/// atomic move: another dispatch of the key in between wins (409).
pub(crate) async fn requeue(
    State(state): State<Shared>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = authorize(&state, &headers) {
        return refused.into_response();
    }
    let stored = match inspect::job_payload(&state.client, &state.pool, &key).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            return ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no stored payload for {key:?}: nothing to requeue"),
            )
            .into_response();
        }
        Err(e) => return ApiError::from(e).into_response(),
    };
    let k = key.clone();
    match with_node(&state, |node| async move {
        match node.stop_job(&k).await {
            Ok(()) | Err(flotilla_pool::Error::JobNotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        node.dispatch_job(&k, stored.payload).await?;
        Ok(format!("requeued {k:?}: running on {}", owner(&node, &k)))
    })
    .await
    {
        Ok(message) => done("requeue", key, message),
        Err(e) => e.into_response(),
    }
}

/// `POST /api/workers/{id}/drain`: not offered by the pool's public API.
pub(crate) async fn drain(
    State(state): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = authorize(&state, &headers) {
        return refused.into_response();
    }
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        format!(
            "cannot drain {id:?}: the pool's public API has no call to drain another \
             process's worker (only its own node can: Node::remove_worker or Node::close)"
        ),
    )
    .into_response()
}

/// `POST /api/workers/{id}/remove`: not offered by the pool's public API.
pub(crate) async fn remove(
    State(state): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = authorize(&state, &headers) {
        return refused.into_response();
    }
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        format!(
            "cannot remove {id:?}: the pool's public API has no call for it; every \
             worker node removes a dead worker by itself one worker TTL after its \
             last keep-alive (its jobs move then)"
        ),
    )
    .into_response()
}

fn owner(node: &Node, key: &str) -> String {
    node.job_owner(key).map_or_else(
        || "its worker".to_string(),
        |(w, t)| format!("{w} (fencing token {t})"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"secret", b"secret"));
        assert!(!same(b"secret", b"secreT"));
        assert!(!same(b"secret", b"secret2"));
        assert!(!same(b"", b"x"));
    }
}
