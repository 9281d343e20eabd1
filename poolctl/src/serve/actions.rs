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
        .mirror_jobs(false)
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

/// The one path of every action: checks the bearer token, runs `act` on
/// a client-only node, answers with [`ActionDone`] or the error. `subject`
/// is the job key or worker id the action is about.
async fn run_action<F, Fut>(
    state: &Shared,
    headers: &HeaderMap,
    action: &'static str,
    subject: String,
    act: F,
) -> Response
where
    F: FnOnce(Node) -> Fut,
    Fut: std::future::Future<Output = Result<String, ApiError>>,
{
    if let Err(refused) = authorize(state, headers) {
        return refused.into_response();
    }
    match with_node(state, act).await {
        Ok(message) => done(action, subject, message),
        Err(e) => e.into_response(),
    }
}

/// `POST /api/jobs/{key}/stop`: stops a running job.
pub(crate) async fn stop(
    State(state): State<Shared>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    let k = key.clone();
    run_action(&state, &headers, "stop", key, |node| async move {
        node.stop_job(&k).await?;
        Ok(format!("stopped {k:?}"))
    })
    .await
}

/// Where the payload of a (re)start comes from.
enum Payload {
    /// The request's body: a new dispatch.
    Given(Bytes),
    /// The job's stored payload: the running job is stopped first and
    /// dispatched again.
    Stored,
}

/// `POST /api/jobs/{key}/dispatch` (body: the payload bytes): starts a job
/// and answers once a worker runs it.
pub(crate) async fn dispatch(
    State(state): State<Shared>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    start_job(&state, &headers, key, Payload::Given(body)).await
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
    start_job(&state, &headers, key, Payload::Stored).await
}

/// Dispatch and requeue: one path, the payload's source apart.
async fn start_job(state: &Shared, headers: &HeaderMap, key: String, payload: Payload) -> Response {
    // The stored payload is read only for an authorized request.
    if let Err(refused) = authorize(state, headers) {
        return refused.into_response();
    }
    let (action, payload, restart) = match payload {
        Payload::Given(body) => ("dispatch", body, false),
        Payload::Stored => match inspect::job_payload(&state.client, &state.pool, &key).await {
            Ok(Some(p)) => ("requeue", p.payload, true),
            Ok(None) => {
                return ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("no stored payload for {key:?}: nothing to requeue"),
                )
                .into_response();
            }
            Err(e) => return ApiError::from(e).into_response(),
        },
    };
    let k = key.clone();
    run_action(state, headers, action, key, |node| async move {
        if restart {
            match node.stop_job(&k).await {
                Ok(()) | Err(flotilla_pool::Error::JobNotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        node.dispatch_job(&k, payload).await?;
        let verb = if restart { "requeued" } else { "dispatched" };
        Ok(format!(
            "{verb} {k:?}: running on {}",
            crate::admin::owner_text(&node, &k).await
        ))
    })
    .await
}

/// `POST /api/workers/{id}/drain`: no new job goes to the worker and its
/// jobs move to other workers (they stay while no other worker is
/// active). 404 for an unknown worker.
pub(crate) async fn drain(
    State(state): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let w = id.clone();
    run_action(&state, &headers, "drain", id, |node| async move {
        Ok(if node.drain_worker(&w).await? {
            format!("drained {w:?}: no new job goes to it; its jobs move to other workers")
        } else {
            format!("{w:?} was drained already")
        })
    })
    .await
}

/// `POST /api/workers/{id}/undrain`: the worker takes its share of jobs
/// again. 404 for an unknown worker.
pub(crate) async fn undrain(
    State(state): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let w = id.clone();
    run_action(&state, &headers, "undrain", id, |node| async move {
        Ok(if node.undrain_worker(&w).await? {
            format!("undrained {w:?}: it takes its share of jobs again")
        } else {
            format!("{w:?} was not drained")
        })
    })
    .await
}

/// `POST /api/workers/{id}/remove`: removes a dead worker now (its jobs
/// and queued events are requeued to live workers). 409 while Redis holds
/// a keep-alive of it within the worker TTL, 404 for an unknown worker.
pub(crate) async fn remove(
    State(state): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let w = id.clone();
    run_action(&state, &headers, "remove", id, |node| async move {
        let removal = node.remove_dead_worker(&w).await?;
        Ok(crate::admin::removal_text(&w, removal))
    })
    .await
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
