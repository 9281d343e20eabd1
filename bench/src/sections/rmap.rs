//! Replicated map figures: local `get`, `set` round trip, and the join of a
//! map of 100,000 keys.

use std::time::{Duration, Instant};

use flotilla_rmap::{Map, MapOptions};
use fred::prelude::*;

use crate::probe;
use crate::report::{Figure, Report};
use crate::{BoxError, Ctx};

const KEYS: usize = 1_000;
const READS: usize = 2_000_000;
const ROUND_TRIPS: usize = 3_000;
const BIG_MAP: usize = 100_000;

/// Runs the section.
pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let name = flotilla_testkit::unique_name("bench-map");
    let map = Map::join(&ctx.client, &name, MapOptions::default()).await?;
    ctx.progress("rmap", "local get, set round trip");
    for i in 0..KEYS {
        map.set(&format!("k{i}"), "value").await?;
    }
    map.wait_for(Duration::from_secs(10), |m| m.len() == KEYS)
        .await?;
    let keys: Vec<String> = (0..KEYS).map(|i| format!("k{i}")).collect();
    let t0 = Instant::now();
    let mut hits = 0usize;
    for i in 0..READS {
        hits += usize::from(std::hint::black_box(map.get(&keys[i % KEYS])).is_some());
    }
    let per_get = t0.elapsed().as_nanos() as f64 / READS as f64;
    if hits != READS {
        return Err(format!("local get missed {} keys", READS - hits).into());
    }
    report.push(
        Figure::new("rmap", "local_get", "rmap local get")
            .value(per_get, "ns")
            .detail(format!("{KEYS}-key map, {READS} reads")),
    );

    let mut h = probe::histogram()?;
    for i in 0..ROUND_TRIPS {
        let t0 = Instant::now();
        map.set(&format!("k{}", i % KEYS), "v").await?;
        probe::record(&mut h, t0.elapsed());
    }
    report.push(
        Figure::new("rmap", "set_p50", "rmap set round trip p50")
            .value(probe::quantile_ms(&h, 0.5), "ms")
            .detail(format!(
                "p99 {:.3} ms; {ROUND_TRIPS} sequential sets",
                probe::quantile_ms(&h, 0.99)
            )),
    );
    map.destroy().await?;

    ctx.progress("rmap", "join a map of 100,000 keys");
    let big = flotilla_testkit::unique_name("bench-big-map");
    let writer = Map::join(&ctx.client, &big, MapOptions::default()).await?;
    let hash = writer.keys_info().hash.clone();
    for chunk in 0..BIG_MAP / 1_000 {
        let pairs: Vec<(String, String)> = (0..1_000)
            .map(|i| {
                let k = chunk * 1_000 + i;
                (format!("job-{k:06}"), format!("worker-{:03}:{k}", k % 500))
            })
            .collect();
        // Bulk fill behind the map's back, then one replicated write so
        // the revision exists.
        let _: () = ctx.client.hset(&hash, pairs).await?;
    }
    writer.set("fill-done", "1").await?;
    let other = flotilla_testkit::client(&ctx.url).await?;
    let t0 = Instant::now();
    let joined = Map::join(&other, &big, MapOptions::default()).await?;
    let join_time = t0.elapsed();
    let len = joined.len();
    report.push(
        Figure::new("rmap", "join_100k", "rmap join of 100k keys")
            .value(join_time.as_secs_f64() * 1000.0, "ms")
            .detail(format!("{len} keys loaded on return")),
    );
    joined.close().await;
    writer.destroy().await?;
    Ok(())
}
