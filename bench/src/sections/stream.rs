//! Stream figures: add rate (sequential and 64 in flight) and add → read
//! latency of a reader.

use std::time::{Duration, Instant};

use flotilla_streaming::{Reader, ReaderOptions, Stream, StreamOptions};
use futures::StreamExt;

use crate::probe;
use crate::report::{Figure, Report};
use crate::{BoxError, Ctx};

const ADDS: usize = 20_000;
const IN_FLIGHT: usize = 64;
const LATENCY_EVENTS: usize = 3_000;

/// Runs the section.
pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    ctx.progress("stream", "add rate");
    let s = Stream::new(
        &ctx.client,
        &flotilla_testkit::unique_name("bench-add"),
        StreamOptions::default(),
    )?;
    let t0 = Instant::now();
    for i in 0..ADDS {
        s.add("e", i.to_string()).await?;
    }
    let sequential = ADDS as f64 / t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let mut adds = futures::stream::iter(0..ADDS)
        .map(|i| {
            let s = s.clone();
            async move { s.add("e", i.to_string()).await }
        })
        .buffer_unordered(IN_FLIGHT);
    while let Some(result) = adds.next().await {
        result?;
    }
    let concurrent = ADDS as f64 / t0.elapsed().as_secs_f64();
    s.destroy().await?;
    report.push(
        Figure::new("stream", "add_rate", "stream add rate, 64 in flight")
            .value(concurrent, "events/s")
            .detail(format!(
                "{ADDS} events; sequential {sequential:.0} events/s"
            )),
    );

    ctx.progress("stream", "add → read latency");
    let s = Stream::new(
        &ctx.client,
        &flotilla_testkit::unique_name("bench-lat"),
        StreamOptions::default(),
    )?;
    let reader = Reader::new(&ctx.client, &[&s], ReaderOptions::default()).await?;
    let mut events = reader.events();
    let mut h = probe::histogram()?;
    for i in 0..LATENCY_EVENTS {
        let t0 = Instant::now();
        s.add("e", i.to_string()).await?;
        tokio::time::timeout(Duration::from_secs(5), events.next())
            .await?
            .ok_or("reader ended")?;
        probe::record(&mut h, t0.elapsed());
    }
    report.push(
        Figure::new("stream", "read_latency_p50", "stream add → read p50")
            .value(probe::quantile_ms(&h, 0.5), "ms")
            .detail(format!("{LATENCY_EVENTS} events one at a time")),
    );
    report.push(
        Figure::new("stream", "read_latency_p99", "stream add → read p99")
            .value(probe::quantile_ms(&h, 0.99), "ms"),
    );
    reader.close().await;
    s.destroy().await?;
    Ok(())
}
