//! `poolctl serve` with 100,000 jobs: every page of the jobs list answers
//! within 200 ms.
//!
//! The pool is filled by writing its records directly, pipelined (1,000
//! fields per `HSET`): the `jobs` map (job key → `"<worker> <token>"`) and
//! the payload hash (`"<created_ms> "` + version byte + MessagePack
//! `[key, payload]`), mirroring the pool's format — dispatching 100,000 jobs
//! through a debug build would take most of a minute. The test checks the
//! mirror against the pool's own decoder (`inspect`) before timing.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use flotilla_pool::inspect::{self, PoolSnapshot};
use flotilla_rmap::MapKeys;
use flotilla_testkit::RedisServer;
use fred::prelude::*;
use support::dashboard::Dashboard;

const JOBS: usize = 100_000;
const WORKERS: usize = 10;
const PAGE_BUDGET: Duration = Duration::from_millis(200);

fn key(i: usize) -> String {
    format!("job-{i:06}")
}

async fn fill(client: &Client, pool: &str) {
    let jobs = MapKeys::new("jobs", Some(pool)).unwrap().hash;
    let workers = MapKeys::new("workers", Some(pool)).unwrap().hash;
    let payloads = format!("fl:{{{pool}}}:payloads");
    let now = inspect::server_time_ms(client).await.unwrap();
    let pipe = client.pipeline();
    let mut registered = HashMap::new();
    for w in 0..WORKERS {
        let info = format!(
            r#"{{"node":"n-fill","host":"filler","pid":1,"created_at_ms":{}}}"#,
            now - 1000 + w as u64
        );
        registered.insert(format!("w-{w}"), info);
    }
    let _: () = pipe.hset(&workers, registered).await.unwrap();
    for chunk in (0..JOBS).collect::<Vec<_>>().chunks(1000) {
        let mut owners: HashMap<String, String> = HashMap::new();
        let mut bodies: HashMap<String, Vec<u8>> = HashMap::new();
        for &i in chunk {
            let k = key(i);
            owners.insert(k.clone(), format!("w-{} {}", i % WORKERS, i + 1));
            let payload = format!(r#"{{"customer":{i},"plan":"standard"}}"#);
            let mut stored = format!("{} ", now - i as u64).into_bytes();
            stored.push(1);
            stored.extend(
                rmp_serde::to_vec(&(k.as_str(), serde_bytes::Bytes::new(payload.as_bytes())))
                    .unwrap(),
            );
            bodies.insert(k, stored);
        }
        let _: () = pipe.hset(&jobs, owners).await.unwrap();
        let _: () = pipe.hset(&payloads, bodies).await.unwrap();
    }
    let _: Vec<Value> = pipe.all().await.unwrap();
}

fn summary(name: &str, times: &mut [Duration]) {
    times.sort();
    let max = *times.last().unwrap();
    eprintln!(
        "{name}: {} requests, median {:?}, p90 {:?}, max {:?}",
        times.len(),
        times[times.len() / 2],
        times[times.len() * 9 / 10],
        max
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_jobs_page_by_page_within_200ms() {
    let server = RedisServer::start()
        .expect("redis-server must be installed (apt-get install redis-server)");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let pool = flotilla_testkit::unique_name("dash-scale");
    let started = Instant::now();
    fill(&client, &pool).await;
    eprintln!("filled {JOBS} jobs in {:?}", started.elapsed());

    // The mirror of the record format is the pool's.
    let stored = inspect::job_payload(&client, &pool, "job-000042")
        .await
        .unwrap()
        .expect("payload decodes");
    assert_eq!(&stored.payload[..], br#"{"customer":42,"plan":"standard"}"#);
    let read_started = Instant::now();
    let snap = PoolSnapshot::read(&client, &pool).await.unwrap();
    eprintln!(
        "PoolSnapshot::read of {} jobs (test build): {:?}",
        snap.jobs.len(),
        read_started.elapsed()
    );
    assert_eq!(snap.jobs.len(), JOBS);
    assert!(snap.malformed.is_empty());

    let dash = Dashboard::start(&server.url(), &pool, false).await;
    // The first request waits for the first reading; later ones never do.
    let (status, _, first) = dash.timed("/api/jobs?limit=1").await;
    assert_eq!(status, 200);
    eprintln!("first request (reads the pool): {first:?}");

    // Every job, page by page (500 a page), in key order, each page fast.
    let mut times = Vec::new();
    let mut next = 0usize;
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(a) => format!("/api/jobs?limit=500&after={a}"),
            None => "/api/jobs?limit=500".to_string(),
        };
        let (status, body, took) = dash.timed(&path).await;
        assert_eq!(status, 200, "{body}");
        assert!(took < PAGE_BUDGET, "{path} took {took:?}");
        times.push(took);
        let page: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(page["matching"], JOBS);
        for j in page["jobs"].as_array().unwrap() {
            assert_eq!(j["key"], key(next));
            assert!(j["payload_size"].as_u64().unwrap() > 0);
            next += 1;
        }
        match page["next_after"].as_str() {
            Some(a) => after = Some(a.to_string()),
            None => break,
        }
    }
    assert_eq!(next, JOBS);
    summary("/api/jobs pages of 500", &mut times);

    // The HTML list, searches and the overview.
    let mut html_times = Vec::new();
    let mut path = "/jobs".to_string();
    for _ in 0..20 {
        let (status, body, took) = dash.timed(&path).await;
        assert_eq!(status, 200);
        assert!(took < PAGE_BUDGET, "{path} took {took:?}");
        html_times.push(took);
        let start = body.find("id=\"next-page\" href=\"").expect("a next page") + 21;
        let end = start + body[start..].find('"').unwrap();
        path = body[start..end].replace("&amp;", "&");
    }
    for search in [
        "/jobs?prefix=job-0999",
        "/jobs?worker=w-3",
        "/jobs?worker=w-7&state=running&after=job-050000",
        "/api/jobs?prefix=job-05&limit=100",
        "/jobs/job-031337",
        "/",
        "/api/overview",
        "/metrics",
    ] {
        let (status, body, took) = dash.timed(search).await;
        assert_eq!(status, 200, "{search}: {body}");
        assert!(took < PAGE_BUDGET, "{search} took {took:?}");
        eprintln!("{search}: {took:?}");
        html_times.push(took);
    }
    summary("HTML pages and searches", &mut html_times);
}
