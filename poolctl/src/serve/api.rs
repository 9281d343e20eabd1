//! The JSON API under `/api/…` (read side), and the error type every
//! route answers with.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::Shared;
use super::cache::Reading;
use super::history::HistorySeries;
use super::jobs::{self, JobDetail, JobPage, JobQuery};
use crate::views::{self, StatusView, StreamView};

/// An error answer: `{"error": "…"}` with a status code.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

/// `GET /api/overview`.
#[derive(Debug, Serialize)]
pub(crate) struct Overview {
    /// Always `"ok"` here (an unreachable Redis answers 503).
    pub(crate) redis: &'static str,
    /// Age of the reading, ms.
    pub(crate) reading_age_ms: u64,
    /// How long the reading took, ms.
    pub(crate) read_took_ms: u64,
    #[serde(flatten)]
    pub(crate) status: StatusView,
    pub(crate) jobs_by_state: JobsByState,
    pub(crate) node_details: Vec<NodeDetail>,
    pub(crate) schedules: Vec<ScheduleView>,
    pub(crate) streams: Vec<StreamView>,
}

/// Job counts by state.
#[derive(Debug, Serialize)]
pub(crate) struct JobsByState {
    pub(crate) running: usize,
    pub(crate) pending: usize,
    /// Stored payloads with neither an owner nor a pending dispatch
    /// (payloads − running − pending; the orphan sweep requeues them).
    pub(crate) orphaned: u64,
    /// Events queued in worker inboxes.
    pub(crate) queued_events: u64,
}

/// A node with the host and pid of its workers.
#[derive(Debug, Serialize)]
pub(crate) struct NodeDetail {
    pub(crate) id: String,
    pub(crate) host: Option<String>,
    pub(crate) pid: Option<u32>,
    /// Since it joined (recorded by the node), else since its oldest
    /// worker registered.
    pub(crate) age_ms: Option<u64>,
    pub(crate) keepalive_age_ms: Option<u64>,
    pub(crate) workers: usize,
    pub(crate) jobs: usize,
    /// The `flotilla-pool` version it runs, as it recorded on joining.
    pub(crate) version: Option<String>,
}

/// A schedule: its leader lease (`schedule:<name>` lock).
#[derive(Debug, Serialize)]
pub(crate) struct ScheduleView {
    pub(crate) name: String,
    pub(crate) leader: String,
    pub(crate) host: String,
    pub(crate) pid: u32,
    pub(crate) token: u64,
    pub(crate) heartbeat_age_ms: u64,
    pub(crate) ttl_remaining_ms: u64,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn unreachable(reason: &str) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("Redis unreachable: {reason}"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message });
        (self.status, Json(body)).into_response()
    }
}

impl From<flotilla_pool::Error> for ApiError {
    fn from(e: flotilla_pool::Error) -> ApiError {
        use flotilla_pool::Error as E;
        let status = match &e {
            E::InvalidName { .. } | E::PayloadTooLarge { .. } | E::InvalidOptions { .. } => {
                StatusCode::BAD_REQUEST
            }
            E::StartFailed { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            E::JobNotFound(_) | E::UnknownWorker(_) => StatusCode::NOT_FOUND,
            E::JobExists(_) | E::AlreadyDispatched { .. } | E::WorkerAlive { .. } => {
                StatusCode::CONFLICT
            }
            E::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            E::Unavailable(_) => return ApiError::unreachable(&e.to_string()),
            E::NoActiveWorker(_)
            | E::PoolFull(_)
            | E::WorkerAtCapacity { .. }
            | E::ShuttingDown(_)
            | E::Closed => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

/// The current reading, or 503 when Redis cannot be read.
pub(crate) async fn reading(state: &Shared) -> Result<Arc<Reading>, ApiError> {
    let current = state.cache.current().await;
    match (current.error, current.reading) {
        (Some(e), _) => Err(ApiError::unreachable(&e)),
        (None, Some(r)) => Ok(r),
        (None, None) => Err(ApiError::unreachable("no reading yet")),
    }
}

/// The overview of `reading`.
pub(crate) fn overview_of(state: &Shared, reading: &Reading) -> Overview {
    let snap = &reading.snapshot;
    let status = views::status_view(snap, &reading.locks, state.worker_ttl);
    let node_details = status
        .nodes
        .iter()
        .map(|n| {
            let workers: Vec<_> = snap.workers.iter().filter(|w| w.node == n.id).collect();
            NodeDetail {
                id: n.id.clone(),
                host: workers.first().map(|w| w.host.clone()),
                pid: workers.first().map(|w| w.pid),
                age_ms: n
                    .joined_at_ms
                    .or_else(|| workers.iter().map(|w| w.created_at_ms).min())
                    .map(|t| snap.server_time_ms.saturating_sub(t)),
                keepalive_age_ms: n.keepalive_age_ms,
                workers: n.workers,
                jobs: n.jobs,
                version: n.version.clone(),
            }
        })
        .collect();
    let schedules = status
        .locks
        .iter()
        .filter_map(|l| {
            Some(ScheduleView {
                name: l.name.strip_prefix("schedule:")?.to_string(),
                leader: l.owner.clone(),
                host: l.host.clone(),
                pid: l.pid,
                token: l.token,
                heartbeat_age_ms: l.heartbeat_age_ms,
                ttl_remaining_ms: l.ttl_remaining_ms,
            })
        })
        .collect();
    let running = snap.jobs.len();
    let pending = snap.pending.len();
    Overview {
        redis: "ok",
        reading_age_ms: reading.age().as_millis() as u64,
        read_took_ms: reading.took.as_millis() as u64,
        jobs_by_state: JobsByState {
            running,
            pending,
            orphaned: snap.payloads.saturating_sub((running + pending) as u64),
            queued_events: snap.queued_events(),
        },
        node_details,
        schedules,
        streams: reading
            .streams
            .iter()
            .map(|s| views::stream_view(snap, s.clone()))
            .collect(),
        status,
    }
}

/// `GET /api/overview`.
pub(crate) async fn overview(State(state): State<Shared>) -> Result<Json<Overview>, ApiError> {
    let reading = reading(&state).await?;
    Ok(Json(overview_of(&state, &reading)))
}

/// One page of the jobs list for `query`.
pub(crate) async fn jobs_page(state: &Shared, query: &JobQuery) -> Result<JobPage, ApiError> {
    query
        .check()
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e))?;
    let reading = reading(state).await?;
    Ok(jobs::page(&state.client, &reading, query).await?)
}

/// `GET /api/jobs?prefix=&worker=&state=&after=&limit=`.
pub(crate) async fn jobs(
    State(state): State<Shared>,
    Query(query): Query<JobQuery>,
) -> Result<Json<JobPage>, ApiError> {
    Ok(Json(jobs_page(&state, &query).await?))
}

/// The job page's data; 404 for a key with no job and no payload.
pub(crate) async fn job_detail(state: &Shared, key: &str) -> Result<JobDetail, ApiError> {
    let reading = reading(state).await?;
    let detail = jobs::detail(&state.client, &reading, key).await?;
    if detail.state == "absent" {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no job {key:?} in pool {:?}", state.pool),
        ));
    }
    Ok(detail)
}

/// `GET /api/jobs/{key}`.
pub(crate) async fn job(
    State(state): State<Shared>,
    Path(key): Path<String>,
) -> Result<Json<JobDetail>, ApiError> {
    Ok(Json(job_detail(&state, &key).await?))
}

/// The history series up to the reading's server time.
pub(crate) async fn history_series(state: &Shared) -> Result<HistorySeries, ApiError> {
    let reading = reading(state).await?;
    let now = reading.snapshot.server_time_ms + reading.age().as_millis() as u64;
    Ok(state.history.series(now).await?)
}

/// `GET /api/history`.
pub(crate) async fn history(State(state): State<Shared>) -> Result<Json<HistorySeries>, ApiError> {
    Ok(Json(history_series(&state).await?))
}

/// Unknown route.
pub(crate) async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such page")
}
