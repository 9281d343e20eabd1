//! Streaming benchmark: add throughput, reader latency, sink throughput and
//! Redis commands per delivered-and-acked event.
//!
//! `cargo run --release -p flotilla-streaming --example stream_bench`
//! (starts a private redis-server unless REDIS_URL is set).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flotilla_streaming::{
    Reader, ReaderOptions, Sink, SinkOptions, StartPosition, Stream, StreamOptions,
};
use fred::prelude::*;
use futures::StreamExt;

const ADDS: usize = 20_000;
const LATENCY_EVENTS: usize = 5_000;
const SINK_EVENTS: usize = 20_000;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (url, _server) = flotilla_testkit::redis_for_example()?;
    let client = flotilla_testkit::client(&url).await?;
    println!("flotilla-streaming benchmark against {url}");

    let s = Stream::new(
        &client,
        &flotilla_testkit::unique_name("bench-add"),
        StreamOptions::default(),
    )?;
    let t = Instant::now();
    for i in 0..ADDS {
        s.add("e", i.to_string()).await?;
    }
    let seq = ADDS as f64 / t.elapsed().as_secs_f64();
    println!("add, sequential:              {seq:>10.0} events/s ({ADDS} events)");
    let t = Instant::now();
    let results: Vec<_> = futures::stream::iter(0..ADDS)
        .map(|i| {
            let s = s.clone();
            async move { s.add("e", i.to_string()).await }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    for r in results {
        r?;
    }
    let conc = ADDS as f64 / t.elapsed().as_secs_f64();
    println!("add, 64 in flight:            {conc:>10.0} events/s ({ADDS} events)");
    s.destroy().await?;

    // Reader latency: add -> received, one event at a time.
    let s = Stream::new(
        &client,
        &flotilla_testkit::unique_name("bench-lat"),
        StreamOptions::default(),
    )?;
    let reader = Reader::new(&client, &[&s], ReaderOptions::default()).await?;
    let mut events = reader.events();
    let mut hist = hdrhistogram::Histogram::<u64>::new(3)?;
    for i in 0..LATENCY_EVENTS {
        let t = Instant::now();
        s.add("e", i.to_string()).await?;
        let _ = tokio::time::timeout(Duration::from_secs(5), events.next())
            .await?
            .ok_or("reader ended")?;
        hist.record(t.elapsed().as_micros() as u64)?;
    }
    println!(
        "reader latency add->received: p50 {:.3} ms, p99 {:.3} ms ({LATENCY_EVENTS} events)",
        hist.value_at_quantile(0.5) as f64 / 1000.0,
        hist.value_at_quantile(0.99) as f64 / 1000.0
    );
    reader.close().await;
    s.destroy().await?;

    for members in [1, 3] {
        let (rate, per_event) = sink_run(&client, members).await?;
        println!(
            "sink, {members} member(s):             {rate:>10.0} events/s delivered+acked; {per_event:.2} Redis commands per event"
        );
    }
    Ok(())
}

async fn total_calls(client: &Client) -> Result<(u64, HashMap<String, u64>), BoxError> {
    let stats = flotilla_testkit::command_stats(client).await?;
    let map: HashMap<String, u64> = stats.into_iter().collect();
    Ok((map.values().sum(), map))
}

async fn sink_run(client: &Client, members: usize) -> Result<(f64, f64), BoxError> {
    let s = Stream::new(
        client,
        &flotilla_testkit::unique_name("bench-sink"),
        StreamOptions::default(),
    )?;
    let results: Vec<_> = futures::stream::iter(0..SINK_EVENTS)
        .map(|i| {
            let s = s.clone();
            async move { s.add("e", i.to_string()).await }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    for r in results {
        r?;
    }
    let name = flotilla_testkit::unique_name("bench-group");
    let (before, before_map) = total_calls(client).await?;
    let done = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let mut sinks = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..members {
        let sink = Arc::new(
            Sink::join(
                client,
                &name,
                &[&s],
                SinkOptions::default().start(StartPosition::Oldest),
            )
            .await?,
        );
        let done = done.clone();
        let sink2 = sink.clone();
        tasks.push(tokio::spawn(async move {
            let mut events = sink2.events();
            while let Some(e) = events.next().await {
                if sink2.ack(&e).await.is_ok() {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
        sinks.push(sink);
    }
    flotilla_testkit::wait_until(Duration::from_secs(120), "sink drained", || {
        let done = done.clone();
        async move { done.load(Ordering::Relaxed) >= SINK_EVENTS as u64 }
    })
    .await?;
    let elapsed = t.elapsed();
    let (after, after_map) = total_calls(client).await?;
    for sink in &sinks {
        sink.close().await;
    }
    for t in tasks {
        t.await?;
    }
    s.destroy().await?;
    // exclude the INFO call itself
    let commands = after.saturating_sub(before).saturating_sub(1);
    if std::env::var("BENCH_VERBOSE").is_ok() {
        let mut delta: Vec<_> = after_map
            .iter()
            .map(|(k, v)| (k.clone(), v - before_map.get(k).copied().unwrap_or(0)))
            .filter(|(_, d)| *d > 0)
            .collect();
        delta.sort();
        println!("  command delta: {delta:?}");
    }
    Ok((
        SINK_EVENTS as f64 / elapsed.as_secs_f64(),
        commands as f64 / SINK_EVENTS as f64,
    ))
}
