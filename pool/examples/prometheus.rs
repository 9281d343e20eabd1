//! Wiring the pool's metrics to Prometheus with `metrics-exporter-prometheus`:
//! the exporter serves `/metrics` over HTTP; a node runs a worker, jobs
//! finish, fail and restart; then the example scrapes its own endpoint once
//! and prints the pool's series.
//!
//! ```text
//! cargo run -p flotilla-pool --example prometheus
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p flotilla-pool --example prometheus
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use flotilla_pool::{
    DispatchOptions, JobStatus, Node, NodeOptions, RestartPolicy, TaskHandler, Worker,
};
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Any free loopback port; a service would use a fixed one.
    let addr: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()?;
    println!("metrics on http://{addr}/metrics");

    let (url, _server) = flotilla_testkit::redis_for_example()?;
    let client = flotilla_testkit::client(&url).await?;
    let pool = format!("prometheus-example-{}", std::process::id());
    let node = Node::join(&client, &pool, NodeOptions::default()).await?;
    let _worker = Worker::new(
        &node,
        TaskHandler::new(|job, cancel| async move {
            match &job.payload[..] {
                b"done" => Ok(()),
                b"broken" => Err("cannot reach the tenant's API".into()),
                _ => {
                    cancel.cancelled().await;
                    Ok(())
                }
            }
        }),
    )
    .await?;

    for i in 0..5 {
        node.dispatch_job(&format!("sync-{i}"), &b"run"[..]).await?;
    }
    node.dispatch_job("report", &b"done"[..]).await?;
    let twice = RestartPolicy::default()
        .first_delay(Duration::from_millis(100))
        .max_failures(2);
    node.dispatch_job_with(
        "broken",
        &b"broken"[..],
        &DispatchOptions::default().restart_policy(twice),
    )
    .await?;
    node.stop_job("sync-0").await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !matches!(
        node.job_status("broken").await?,
        Some(JobStatus::Failed { .. })
    ) {
        if tokio::time::Instant::now() > deadline {
            return Err("the broken job did not fail in time".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let body = scrape(addr).await?;
    let ours: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("flotilla_pool_") && !l.contains("_bucket"))
        .collect();
    for line in &ours {
        println!("{line}");
    }
    for wanted in [
        "flotilla_pool_dispatch_total",
        "flotilla_pool_jobs_finished_total",
        "flotilla_pool_jobs_failed_total",
    ] {
        if !ours.iter().any(|l| l.starts_with(wanted)) {
            return Err(format!("{wanted} missing from /metrics").into());
        }
    }
    node.close().await?;
    Ok(())
}

/// One plain HTTP/1.1 GET of `/metrics`.
async fn scrape(addr: SocketAddr) -> Result<String, Box<dyn std::error::Error>> {
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = String::new();
    conn.read_to_string(&mut response).await?;
    Ok(response)
}
