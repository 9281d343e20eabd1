//! The Redis CPU floor of a keyed dispatch on the server under test: what
//! the smallest protocol that still guards a key costs — a pending guard,
//! an inbox entry, an owner record, the guard cleared and a reply entry,
//! one script per job, pipelined with the same jobs in flight as the
//! throughput run. Redis's CPU per dispatch moves several-fold between
//! machines (and between sessions of one VM); the ratio to this floor,
//! measured in the same run, does not, so figures of different machines
//! can be compared through it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use fred::prelude::*;
use fred::types::scripts::Script;

use crate::redis_stats::redis_cpu_seconds;
use crate::{BoxError, Ctx};

/// KEYS: pending hash, inbox stream, owner hash, reply stream.
/// ARGV: job key, worker, token, payload.
const MINIMAL_DISPATCH: &str = r"
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('XADD', KEYS[2], '*', 'n', 'start', 'p', ARGV[4])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2] .. ' ' .. ARGV[3])
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('XADD', KEYS[4], '*', 'k', ARGV[1], 't', ARGV[3])
return 1
";

/// Redis CPU (µs) per job of `jobs` minimal dispatches, `in_flight` at
/// once; its keys are deleted afterwards.
pub async fn redis_cpu_floor(ctx: &Ctx, jobs: usize, in_flight: usize) -> Result<f64, BoxError> {
    let tag = flotilla_testkit::unique_name("bench-floor");
    let keys: Arc<Vec<String>> = Arc::new(
        ["pending", "inbox", "jobs", "replies"]
            .iter()
            .map(|k| format!("{{{tag}}}:{k}"))
            .collect(),
    );
    let script = Arc::new(Script::from_lua(MINIMAL_DISPATCH));
    script.load(&ctx.client).await?;
    let before = redis_cpu_seconds(&ctx.client).await?;
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..in_flight.max(1) {
        let (client, keys, script, next) = (
            ctx.client.clone(),
            keys.clone(),
            script.clone(),
            next.clone(),
        );
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    return Ok::<(), fred::error::Error>(());
                }
                let args = vec![
                    format!("job-{i}"),
                    "worker-1".into(),
                    i.to_string(),
                    "{}".into(),
                ];
                let _: i64 = script
                    .evalsha_with_reload(&client, keys.to_vec(), args)
                    .await?;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let cpu = redis_cpu_seconds(&ctx.client).await? - before;
    let _: i64 = ctx.client.del(keys.to_vec()).await?;
    Ok(cpu * 1e6 / jobs as f64)
}
