//! HTML pages (maud), rendered from the same data as the JSON API. Each
//! page works without JavaScript; `app.js` refreshes the overview and the
//! charts from the API and runs admin actions.

use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

use super::api::{self, ApiError, Overview};
use super::history::HistorySeries;
use super::jobs::{JobDetail, JobPage, JobQuery};
use super::{Shared, charts, path_segment};
use crate::format;

const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// `GET /static/app.js`.
pub(crate) async fn app_js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        APP_JS,
    )
        .into_response()
}

/// `GET /static/app.css`.
pub(crate) async fn app_css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS).into_response()
}

/// The frame of every page: header, navigation, Redis status, content.
fn layout(state: &Shared, page: &str, error: Option<&ApiError>, content: Markup) -> Markup {
    let title = match page {
        "jobs" => "Jobs",
        "job" => "Job",
        "history" => "History",
        _ => "Overview",
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · " (state.pool) " · poolctl" }
                link rel="stylesheet" href="/static/app.css";
            }
            body data-page=(page) data-pool=(state.pool) data-empty=[error.map(|_| "1")]
                data-admin=[state.admin_token.as_ref().map(|_| "1")] {
                header {
                    div.brand { "Flotilla " span.pool { (state.pool) } }
                    nav {
                        a href="/" class=[(page == "overview").then_some("here")] { "Overview" }
                        a href="/jobs" class=[(page == "jobs" || page == "job").then_some("here")] { "Jobs" }
                        a href="/history" class=[(page == "history").then_some("here")] { "History" }
                    }
                    span #redis-status .(if error.is_some() { "down" } else { "ok" }) {
                        @if error.is_some() { "Redis unreachable" } @else { "Redis ok" }
                    }
                }
                div #banner .banner hidden[error.is_none()] {
                    @if let Some(e) = error { (e.message) } @else { "Redis unreachable" }
                }
                main { (content) }
                script src="/static/app.js" {}
            }
        }
    }
}

/// A page, or the frame with the error when the data could not be read.
fn page(state: &Shared, name: &str, content: Result<Markup, ApiError>) -> Response {
    match content {
        Ok(m) => layout(state, name, None, m).into_response(),
        Err(e) if e.status == StatusCode::SERVICE_UNAVAILABLE => {
            let body = html! { p.empty { "No data while Redis is unreachable; this page reloads when it is back." } };
            (e.status, layout(state, name, Some(&e), body)).into_response()
        }
        Err(e) => {
            let body = html! { p.empty { (e.message) } };
            let status = e.status;
            (status, layout(state, name, None, body)).into_response()
        }
    }
}

/// `GET /`.
pub(crate) async fn overview(State(state): State<Shared>) -> Response {
    let content = async {
        let reading = api::reading(&state).await?;
        let view = api::overview_of(&state, &reading);
        let history = api::history_series(&state).await.ok();
        Ok(overview_body(
            &view,
            history.as_ref(),
            state.admin_token.is_some(),
        ))
    }
    .await;
    page(&state, "overview", content)
}

fn ago(ms: Option<u64>) -> String {
    format::ago(ms)
}

/// The admin buttons of a worker row (`app.js` renders the same).
fn worker_actions(state: &str) -> Markup {
    html! {
        td.actions {
            @if state == "drained" {
                button data-worker-action="undrain" { "Undrain" }
            } @else {
                button data-worker-action="drain" { "Drain" }
            }
            button data-worker-action="remove" { "Remove" }
        }
    }
}

fn overview_body(v: &Overview, history: Option<&HistorySeries>, admin: bool) -> Markup {
    let s = &v.status;
    let c = &s.counts;
    let card = |key: &str, value: String, label: &str| {
        html! { div.card { span.num data-count=(key) { (value) } span.label { (label) } } }
    };
    html! {
        section.cards {
            (card("running", v.jobs_by_state.running.to_string(), "running"))
            (card("pending", v.jobs_by_state.pending.to_string(), "pending"))
            (card("orphaned", v.jobs_by_state.orphaned.to_string(), "orphaned"))
            (card("queued_events", v.jobs_by_state.queued_events.to_string(), "queued events"))
            (card("active_workers", format!("{}/{}", c.active_workers, c.workers), "workers active"))
            (card("nodes", c.nodes.to_string(), "nodes"))
        }
        p.meta #reading-meta {
            "Read " (format::duration_ms(v.reading_age_ms)) " ago in "
            (format::duration_ms(v.read_took_ms)) " · worker TTL "
            (format::duration_ms(s.worker_ttl_ms))
            @if let Some(by) = &s.shutdown_requested_by { " · shutdown requested by " (by) }
        }
        @if let Some(h) = history {
            @if let Some(series) = h.series.first() {
                section.mini { (charts::chart(series)) }
            }
        }
        h2 { "Workers" }
        @if admin {
            section.actions #worker-actions {
                p {
                    "Drain: no new job goes to the worker and its jobs move to others. "
                    "Remove: requeue a dead worker's jobs now (refused while it renews). "
                    "Sent with your admin token as a bearer header (kept in this tab only)."
                }
                input #admin-token type="password" placeholder="admin token" autocomplete="off";
                pre #action-result {}
            }
        }
        table #workers {
            thead { tr { th { "worker" } th { "state" } th { "node" } th { "host" } th { "pid" }
                th { "keep-alive" } th.n { "jobs" } th.n { "inbox" }
                @if admin { th { "actions" } } } }
            tbody #workers-body {
                @for w in &s.workers {
                    tr data-worker=(w.id) {
                        td { a href=(format!("/jobs?worker={}", path_segment(&w.id))) { code { (w.id) } } }
                        td { span class=(format!("state {}", w.state)) { (w.state) } }
                        td { code { (w.node) } }
                        td { (w.host) } td { (w.pid) }
                        td { (ago(w.keepalive_age_ms)) }
                        td.n { (w.jobs) } td.n { (w.inbox_length) }
                        @if admin { (worker_actions(w.state)) }
                    }
                }
                @if s.workers.is_empty() { tr { td colspan=(if admin { "9" } else { "8" }) { "no worker" } } }
            }
        }
        h2 { "Nodes" }
        table #nodes {
            thead { tr { th { "node" } th { "host" } th { "pid" } th { "age" } th { "keep-alive" }
                th.n { "workers" } th.n { "jobs" } th { "version" } } }
            tbody #nodes-body {
                @for n in &v.node_details {
                    tr {
                        td { code { (n.id) } }
                        td { (n.host.as_deref().unwrap_or("-")) }
                        td { (n.pid.map_or("-".into(), |p| p.to_string())) }
                        td { (n.age_ms.map_or("-".into(), format::duration_ms)) }
                        td { (ago(n.keepalive_age_ms)) }
                        td.n { (n.workers) } td.n { (n.jobs) }
                        td { (n.version.as_deref().unwrap_or("-")) }
                    }
                }
            }
        }
        h2 { "Locks and leader leases" }
        table #locks {
            thead { tr { th { "lock" } th { "holder" } th { "host" } th { "pid" } th.n { "token" }
                th { "heartbeat" } th { "expires in" } } }
            tbody #locks-body {
                @for l in &s.locks {
                    tr {
                        td { code { (l.name) } } td { code { (l.owner) } } td { (l.host) } td { (l.pid) }
                        td.n { (l.token) } td { (ago(Some(l.heartbeat_age_ms))) }
                        td { (format::duration_ms(l.ttl_remaining_ms)) }
                    }
                }
                @if s.locks.is_empty() { tr { td colspan="7" { "no lock held" } } }
            }
        }
        h2 { "Schedules" }
        table #schedules {
            thead { tr { th { "schedule" } th { "leader" } th { "host" } th.n { "token" } th { "heartbeat" } } }
            tbody #schedules-body {
                @for sc in &v.schedules {
                    tr { td { code { (sc.name) } } td { code { (sc.leader) } } td { (sc.host) }
                        td.n { (sc.token) } td { (ago(Some(sc.heartbeat_age_ms))) } }
                }
                @if v.schedules.is_empty() { tr { td colspan="5" { "no schedule has a leader" } } }
            }
        }
        h2 { "Streams" }
        table #streams {
            thead { tr { th { "stream" } th { "kind" } th.n { "length" } th.n { "groups" } } }
            tbody #streams-body {
                @for st in &v.streams {
                    tr { td { code { (st.name) } } td { (st.kind) } td.n { (st.length) } td.n { (st.groups.len()) } }
                }
            }
        }
    }
}

/// `GET /jobs?prefix=&worker=&state=&after=&limit=`.
pub(crate) async fn jobs(State(state): State<Shared>, Query(query): Query<JobQuery>) -> Response {
    let content = api::jobs_page(&state, &query)
        .await
        .map(|p| jobs_body(&query, &p));
    page(&state, "jobs", content)
}

fn query_link(q: &JobQuery, after: Option<&str>) -> String {
    let mut parts = Vec::new();
    let mut add = |name: &str, value: Option<&str>| {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            parts.push(format!("{name}={}", path_segment(v)));
        }
    };
    add("prefix", q.prefix.as_deref());
    add("worker", q.worker.as_deref());
    add("state", q.state.as_deref());
    add("limit", q.limit.map(|l| l.to_string()).as_deref());
    add("after", after);
    format!("/jobs?{}", parts.join("&"))
}

fn jobs_body(q: &JobQuery, p: &JobPage) -> Markup {
    let state = q.state.as_deref().unwrap_or("all");
    html! {
        form.search method="get" action="/jobs" {
            label { "key prefix " input type="text" name="prefix" value=[q.prefix.as_deref()]; }
            label { "worker " input type="text" name="worker" value=[q.worker.as_deref()]; }
            label { "state "
                select name="state" {
                    @for s in ["all", "running", "pending"] {
                        option value=(s) selected[s == state] { (s) }
                    }
                }
            }
            button type="submit" { "Search" }
        }
        p.meta #jobs-meta { (p.matching) " matching · read " (format::duration_ms(p.reading_age_ms)) " ago" }
        table #jobs {
            thead { tr { th { "key" } th { "state" } th { "owner" } th.n { "token" } th { "age" } th.n { "payload" } } }
            tbody {
                @for j in &p.jobs {
                    tr {
                        td { a.job-link href=(format!("/jobs/{}", path_segment(&j.key))) { code { (j.key) } } }
                        td { span class=(format!("state {}", j.state)) { (j.state) } }
                        td { code { (j.owner.as_deref().unwrap_or("-")) } }
                        td.n { (j.token) }
                        td { (j.age_ms.map_or("-".into(), format::duration_ms)) }
                        td.n { (j.payload_size.map_or("-".into(), format::bytes)) }
                    }
                }
                @if p.jobs.is_empty() { tr { td colspan="6" { "no job matches" } } }
            }
        }
        nav.pages {
            @if q.after.is_some() { a #first-page href=(query_link(q, None)) { "« first page" } }
            @if let Some(next) = &p.next_after { a #next-page href=(query_link(q, Some(next))) { "next page »" } }
        }
    }
}

/// `GET /jobs/{key}`.
pub(crate) async fn job(State(state): State<Shared>, Path(key): Path<String>) -> Response {
    let admin = state.admin_token.is_some();
    let content = api::job_detail(&state, &key)
        .await
        .map(|d| job_body(&d, admin));
    page(&state, "job", content)
}

fn job_body(d: &JobDetail, admin: bool) -> Markup {
    html! {
        h1.job-key { code #job-key { (d.key) } " " span class=(format!("state {}", d.state)) { (d.state) } }
        dl.facts {
            dt { "owner" } dd #job-owner { code { (d.owner.as_deref().unwrap_or("-")) } }
            dt { "fencing token" } dd #job-token { (d.fencing_token.map_or("-".into(), |t| t.to_string())) }
            dt { "first admitted" } dd { (ago(d.age_ms)) }
            dt { "payload" } dd { (d.payload_size.map_or("none".into(), format::bytes)) }
            dt { "failures" } dd #job-failures { (d.failures) }
            @if let Some(error) = &d.last_error {
                dt { "last error" } dd #job-last-error { code { (error) } }
            }
        }
        @if let Some(json) = &d.payload_json {
            h2 { "Payload (JSON)" } pre.payload #payload-json { (json) }
        } @else if let Some(text) = &d.payload_text {
            h2 { "Payload (text)" } pre.payload #payload-text { (text) }
        }
        @if let Some(hex) = &d.payload_hex {
            h2 { "Payload (hex)" @if d.payload_truncated { " — first " (super::jobs::PAYLOAD_SHOWN) " bytes" } }
            pre.payload #payload-hex { (hex) }
        }
        section.actions #actions data-key=(d.key) {
            h2 { "Actions" }
            @if admin {
                p { "Sent with your admin token as a bearer header (kept in this tab only)." }
                input #admin-token type="password" placeholder="admin token" autocomplete="off";
                button data-action="stop" { "Stop" }
                button data-action="requeue" { "Requeue" }
                pre #action-result {}
            } @else {
                p { "Read-only: start " code { "poolctl serve --admin-token …" } " to stop or requeue jobs." }
            }
        }
    }
}

/// `GET /history`.
pub(crate) async fn history(State(state): State<Shared>) -> Response {
    let content = api::history_series(&state).await.map(|h| history_body(&h));
    page(&state, "history", content)
}

fn history_body(h: &HistorySeries) -> Markup {
    let t = &h.totals;
    html! {
        p.meta {
            "Last hour, 10-second buckets, from " (h.nodes) " node(s): "
            (t.dispatches) " dispatches, " (t.starts) " starts, " (t.stops) " stops, "
            (t.dead_workers) " dead workers, " (t.moves) " moves."
            @if h.malformed > 0 { " " (h.malformed) " undecodable entries left out." }
        }
        section.charts { @for s in &h.series { (charts::chart(s)) } }
    }
}
