//! `Ticker` against a real Redis: one tick per interval pool-wide, no slot
//! ticked twice, and the others keep ticking when one ticker closes.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_pool::{Error, Tick, Ticker, TickerOptions};
use flotilla_testkit::{RedisServer, unique_name};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// (ticker index, tick, when it arrived).
type Ledger = Arc<Mutex<Vec<(usize, Tick, Instant)>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_tick_per_interval_pool_wide() {
    let server = RedisServer::start().expect("redis-server");
    let name = unique_name("tick");
    let interval = Duration::from_millis(200);
    let ledger: Ledger = Arc::default();
    let stop_all = CancellationToken::new();
    let mut stops = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..3 {
        let client = flotilla_testkit::client(&server.url())
            .await
            .expect("client");
        let mut ticker = Ticker::start(&client, &name, interval, TickerOptions::default())
            .await
            .expect("ticker");
        let stop = stop_all.child_token();
        stops.push(stop.clone());
        let ledger = Arc::clone(&ledger);
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    tick = ticker.next() => match tick {
                        Some(tick) => ledger.lock().unwrap().push((i, tick, Instant::now())),
                        None => break,
                    },
                }
            }
            ticker.close().await;
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    // Close ticker 0 mid-run.
    stops[0].cancel();
    let closed_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    stop_all.cancel();
    for task in tasks {
        task.await.expect("task");
    }
    let elapsed = started.elapsed();

    let ledger = ledger.lock().unwrap().clone();
    let slots: Vec<u64> = ledger.iter().map(|(_, t, _)| t.slot).collect();
    let unique: HashSet<u64> = slots.iter().copied().collect();
    assert_eq!(
        unique.len(),
        slots.len(),
        "a slot was ticked twice: {slots:?}"
    );
    let expected = elapsed.as_millis() as f64 / interval.as_millis() as f64;
    assert!(
        (slots.len() as f64 - expected).abs() <= 2.0,
        "{} ticks in {elapsed:?}, expected about {expected:.1}",
        slots.len()
    );
    let after_close: Vec<&(usize, Tick, Instant)> =
        ledger.iter().filter(|(_, _, at)| *at > closed_at).collect();
    assert!(
        after_close.len() >= 4,
        "the others stopped ticking: {after_close:?}"
    );
    assert!(
        after_close.iter().all(|(i, _, _)| *i != 0),
        "a closed ticker ticked"
    );
    let mut sorted = slots.clone();
    sorted.sort_unstable();
    let gaps = sorted.windows(2).filter(|w| w[1] != w[0] + 1).count();
    assert!(gaps <= 1, "slots skipped: {sorted:?}");
    let winners: HashSet<usize> = ledger.iter().map(|(i, _, _)| *i).collect();
    println!(
        "{} ticks in {elapsed:?} at {interval:?} (expected ≈{expected:.1}); won by tickers {winners:?}",
        slots.len()
    );
}

#[tokio::test]
async fn ticker_refuses_bad_input() {
    let server = RedisServer::start().expect("redis-server");
    let client = flotilla_testkit::client(&server.url())
        .await
        .expect("client");
    let bad_name = Ticker::start(
        &client,
        "a{b}",
        Duration::from_secs(1),
        TickerOptions::default(),
    )
    .await;
    assert!(matches!(bad_name, Err(Error::InvalidName { .. })));
    let bad_interval = Ticker::start(
        &client,
        "ok",
        Duration::from_millis(1),
        TickerOptions::default(),
    )
    .await;
    assert!(matches!(
        bad_interval,
        Err(Error::InvalidOptions {
            option: "interval",
            ..
        })
    ));
}
