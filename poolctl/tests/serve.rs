//! `poolctl serve` against a live pool on a private Redis: every page and
//! API route, admin actions and their refusals, and a Redis restart.

mod support;

use std::time::Duration;

use flotilla_testkit::wait_until;
use support::LivePool;
use support::dashboard::{Dashboard, TOKEN, bearer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_and_api_route_answers() {
    let live = LivePool::start("dash-routes").await;
    let dash = Dashboard::start(&live.server.url(), &live.pool, false).await;
    let workers: Vec<String> = live.workers.iter().map(|w| w.id().to_string()).collect();

    // Overview, as HTML and JSON.
    let (status, html) = dash.get("/").await;
    assert_eq!(status, 200, "{html}");
    for w in &workers {
        assert!(html.contains(w.as_str()), "overview lacks worker {w}");
    }
    assert!(html.contains(r#"data-count="running">5<"#), "{html}");
    assert!(html.contains("scheduler"), "overview lacks the lock");
    let v = dash.json("/api/overview").await;
    assert_eq!(v["redis"], "ok");
    assert_eq!(v["jobs_by_state"]["running"], 5);
    assert_eq!(v["jobs_by_state"]["pending"], 0);
    assert_eq!(v["workers"].as_array().unwrap().len(), 3);
    assert_eq!(v["node_details"].as_array().unwrap().len(), 2);
    // Each node recorded its version (the workspace's, poolctl's too) and
    // its join time.
    for n in v["node_details"].as_array().unwrap() {
        assert_eq!(n["version"], env!("CARGO_PKG_VERSION"), "{n}");
        assert!(n["age_ms"].as_u64().is_some(), "{n}");
    }
    assert!(
        v["nodes"][0]["joined_at_ms"].as_u64().is_some(),
        "{}",
        v["nodes"]
    );
    assert_eq!(v["locks"][0]["name"], "scheduler");
    assert_eq!(v["locks"][0]["owner"], "test-owner");
    // The streams are those the pool's inspector finds (an inbox exists
    // once something was queued to it).
    let shown: Vec<&str> = v["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    let found: Vec<String> = flotilla_pool::inspect::streams(&live.direct, &live.pool)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(shown, found);
    assert!(shown.iter().any(|s| s.starts_with("inbox:")), "{shown:?}");

    // Jobs list: search, filters and keyset pages.
    let all = dash.json("/api/jobs").await;
    assert_eq!(all["matching"], 5);
    let running = dash.json("/api/jobs?prefix=job-&state=running").await;
    let keys: Vec<&str> = running["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["job-a", "job-b", "job-c"]);
    assert_eq!(running["jobs"][1]["payload_size"], 13);
    let owner = running["jobs"][0]["owner"].as_str().unwrap().to_string();
    let by_worker = dash
        .json(&format!("/api/jobs?worker={owner}&limit=500"))
        .await;
    assert!(
        by_worker["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|j| j["owner"] == owner.as_str())
    );
    let mut seen = Vec::new();
    let mut path = "/api/jobs?limit=2".to_string();
    loop {
        let page = dash.json(&path).await;
        for j in page["jobs"].as_array().unwrap() {
            seen.push(j["key"].as_str().unwrap().to_string());
        }
        match page["next_after"].as_str() {
            Some(after) => path = format!("/api/jobs?limit=2&after={after}"),
            None => break,
        }
    }
    assert_eq!(seen, ["job-a", "job-b", "job-c", "other-1", "other-2"]);
    assert_eq!(dash.get("/api/jobs?state=bogus").await.0, 400);
    let (status, html) = dash.get("/jobs?prefix=job-&limit=2").await;
    assert_eq!(status, 200);
    assert!(html.contains("job-a") && html.contains("job-b") && !html.contains("job-c<"));
    assert!(html.contains(r#"id="next-page""#), "{html}");

    // Job pages.
    let job = dash.json("/api/jobs/job-c").await;
    assert_eq!(job["state"], "running");
    assert!(job["fencing_token"].as_u64().unwrap() > 0);
    assert!(
        job["payload_hex"]
            .as_str()
            .unwrap()
            .contains("00 9f 92 96 ff")
    );
    assert_eq!(job["payload_text"], serde_json::Value::Null);
    let job = dash.json("/api/jobs/other-2").await;
    assert_eq!(job["payload_json"], "{\n  \"n\": 2\n}");
    let (status, html) = dash.get("/jobs/job-b").await;
    assert_eq!(status, 200);
    assert!(html.contains("bravo payload") && html.contains("Read-only"));
    assert_eq!(dash.get("/api/jobs/no-such-job").await.0, 404);
    assert_eq!(dash.get("/jobs/no-such-job").await.0, 404);

    // History: the dispatches of the live pool reach the stream within a
    // flush or two.
    wait_until(
        Duration::from_secs(15),
        "history shows 5 dispatches",
        || {
            let dash = &dash;
            async move {
                let h = dash.json("/api/history").await;
                h["totals"]["dispatches"].as_u64() >= Some(5)
                    && h["totals"]["starts"].as_u64() >= Some(5)
            }
        },
    )
    .await
    .unwrap();
    let h = dash.json("/api/history").await;
    assert_eq!(h["series"].as_array().unwrap().len(), 5);
    assert_eq!(h["series"][0]["values"].as_array().unwrap().len(), 360);
    let (status, html) = dash.get("/history").await;
    assert_eq!(status, 200);
    assert!(html.contains("<polyline") && html.contains("dispatches / s"));

    // Metrics, assets, unknown routes.
    let (status, text) = dash.get("/metrics").await;
    assert_eq!(status, 200);
    let pool = &live.pool;
    for line in [
        "flotilla_dashboard_redis_up 1".to_string(),
        format!("flotilla_pool_jobs{{pool=\"{pool}\",state=\"running\"}} 5"),
        format!("flotilla_pool_workers{{pool=\"{pool}\",state=\"active\"}} 3"),
        format!(
            "flotilla_pool_lock_held{{pool=\"{pool}\",lock=\"scheduler\",holder=\"test-owner\"}} 1"
        ),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "/metrics lacks {line:?}:\n{text}"
        );
    }
    let (status, js) = dash.get("/static/app.js").await;
    assert!(status == 200 && js.contains("/api/overview"));
    let (status, css) = dash.get("/static/app.css").await;
    assert!(status == 200 && css.contains(".card"));
    assert_eq!(dash.get("/no/such/page").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_actions_need_the_bearer_token() {
    let live = LivePool::start("dash-admin").await;
    let read_only = Dashboard::start(&live.server.url(), &live.pool, false).await;
    let dash = Dashboard::start(&live.server.url(), &live.pool, true).await;

    // Read-only dashboard: 403 whatever is sent.
    for auth in [None, Some(bearer())] {
        let r = read_only
            .post("/api/jobs/job-a/stop", auth.as_deref(), b"")
            .await;
        assert_eq!(r.status().as_u16(), 403);
    }
    // With a token: 401 without a bearer header, 403 with a wrong one.
    for path in [
        "/api/jobs/job-a/stop",
        "/api/jobs/job-a/requeue",
        "/api/jobs/new-1/dispatch",
        "/api/workers/w/drain",
        "/api/workers/w/undrain",
        "/api/workers/w/remove",
    ] {
        let r = dash.post(path, None, b"").await;
        assert_eq!(r.status().as_u16(), 401, "{path}");
        assert_eq!(
            r.headers()["www-authenticate"].to_str().unwrap(),
            "Bearer realm=\"poolctl\""
        );
        let r = dash.post(path, Some(&format!("Basic {TOKEN}")), b"").await;
        assert_eq!(r.status().as_u16(), 401, "{path}");
        let r = dash.post(path, Some("Bearer wrong"), b"").await;
        assert_eq!(r.status().as_u16(), 403, "{path}");
    }
    // GET is no way around it.
    assert_eq!(dash.get("/api/jobs/job-a/stop").await.0, 405);
    assert!(live.seen.lock().unwrap().running.contains_key("job-a"));

    // Stop.
    let r = dash
        .post("/api/jobs/job-a/stop", Some(&bearer()), b"")
        .await;
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
    assert!(!live.seen.lock().unwrap().running.contains_key("job-a"));
    let r = dash
        .post("/api/jobs/job-a/stop", Some(&bearer()), b"")
        .await;
    assert_eq!(r.status().as_u16(), 404);

    // Dispatch with a payload.
    let r = dash
        .post(
            "/api/jobs/new-1/dispatch",
            Some(&bearer()),
            b"from the dashboard",
        )
        .await;
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
    let running = live.seen.lock().unwrap().running.get("new-1").cloned();
    assert_eq!(running.unwrap().1.as_ref(), b"from the dashboard");
    let r = dash
        .post("/api/jobs/new-1/dispatch", Some(&bearer()), b"")
        .await;
    assert_eq!(r.status().as_u16(), 409);

    // Requeue: a new start with the stored payload and a new token.
    let before = dash.json("/api/jobs/job-b").await["fencing_token"]
        .as_u64()
        .unwrap();
    let r = dash
        .post("/api/jobs/job-b/requeue", Some(&bearer()), b"")
        .await;
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
    assert_eq!(
        live.seen.lock().unwrap().running["job-b"].1.as_ref(),
        b"bravo payload"
    );
    wait_until(Duration::from_secs(10), "job-b has a new token", || {
        let dash = &dash;
        async move { dash.json("/api/jobs/job-b").await["fencing_token"].as_u64() > Some(before) }
    })
    .await
    .unwrap();
    let r = dash
        .post("/api/jobs/never-was/requeue", Some(&bearer()), b"")
        .await;
    assert_eq!(r.status().as_u16(), 404);

    // Drain: the worker's jobs move to the others, the overview says so.
    let drained = live.workers[0].id().to_string();
    let path = format!("/api/workers/{drained}/drain");
    let read_only_drain = read_only.post(&path, Some(&bearer()), b"").await;
    assert_eq!(read_only_drain.status().as_u16(), 403);
    let r = dash.post(&path, Some(&bearer()), b"").await;
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
    let body: serde_json::Value = dash
        .post(&path, Some(&bearer()), b"")
        .await
        .json()
        .await
        .unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("drained already"),
        "{body}"
    );
    wait_until(
        Duration::from_secs(10),
        "the drained worker's jobs moved",
        || {
            let (live, drained) = (&live, &drained);
            async move {
                let seen = live.seen.lock().unwrap();
                seen.running.len() == 5 && seen.running.values().all(|(w, _)| w != drained)
            }
        },
    )
    .await
    .unwrap();
    wait_until(
        Duration::from_secs(10),
        "the overview shows it drained",
        || {
            let (dash, drained) = (&dash, &drained);
            async move {
                let v = dash.json("/api/overview").await;
                let w = v["workers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|w| w["id"] == drained.as_str())
                    .cloned();
                v["counts"]["drained_workers"] == 1
                    && w.is_some_and(|w| {
                        w["state"] == "drained" && w["drained_at_ms"].as_u64().is_some()
                    })
            }
        },
    )
    .await
    .unwrap();
    let (_, metrics) = dash.get("/metrics").await;
    let gauge = format!(
        "flotilla_pool_workers{{pool=\"{}\",state=\"drained\"}} 1",
        live.pool
    );
    assert!(metrics.contains(&gauge), "{metrics}");
    let (_, page) = dash.get("/").await;
    assert!(
        page.contains("data-worker-action=\"undrain\""),
        "an Undrain button"
    );
    let (_, page) = read_only.get("/").await;
    assert!(
        !page.contains("data-worker-action"),
        "no button without a token"
    );
    let r = dash
        .post(
            &format!("/api/workers/{drained}/undrain"),
            Some(&bearer()),
            b"",
        )
        .await;
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);

    // Remove: a live worker is refused (409), an unknown one is 404.
    let live_worker = live.workers[1].id().to_string();
    let r = dash
        .post(
            &format!("/api/workers/{live_worker}/remove"),
            Some(&bearer()),
            b"",
        )
        .await;
    assert_eq!(r.status().as_u16(), 409);
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("alive"), "{body}");
    for path in [
        "/api/workers/no-such-worker/drain",
        "/api/workers/no-such-worker/undrain",
        "/api/workers/no-such-worker/remove",
    ] {
        let r = dash.post(path, Some(&bearer()), b"").await;
        assert_eq!(r.status().as_u16(), 404, "{path}");
    }
    wait_until(Duration::from_secs(10), "all five jobs run", || {
        let n = live.seen.lock().unwrap().running.len();
        async move { n == 5 }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_a_redis_restart() {
    let mut live = LivePool::start("dash-restart").await;
    let mut dash = Dashboard::start(&live.server.url(), &live.pool, false).await;
    assert_eq!(
        dash.json("/api/overview").await["jobs_by_state"]["running"],
        5
    );

    live.server.kill();
    wait_until(
        Duration::from_secs(20),
        "the API reports Redis down",
        || {
            let dash = &dash;
            async move { dash.get("/api/overview").await.0 == 503 }
        },
    )
    .await
    .unwrap();
    let (status, html) = dash.get("/").await;
    assert_eq!(status, 503);
    assert!(html.contains("Redis unreachable"), "{html}");
    let (_, body) = dash.get("/api/overview").await;
    assert!(body.contains("Redis unreachable"), "{body}");
    let (status, metrics) = dash.get("/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("flotilla_dashboard_redis_up 0"),
        "{metrics}"
    );

    live.server.start_again().unwrap();
    wait_until(Duration::from_secs(30), "the overview is back", || {
        let dash = &dash;
        async move { dash.get("/api/overview").await.0 == 200 }
    })
    .await
    .unwrap();
    let (status, html) = dash.get("/").await;
    assert_eq!(status, 200);
    assert!(html.contains("Redis ok"));
    assert!(dash.is_running());
}
