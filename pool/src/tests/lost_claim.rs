//! A cleaner that finds its claim on a worker gone (the worker came back
//! and cleared it, or another node took it over) stops there: it moves
//! nothing of the worker, and does not walk the rest of the worker's jobs
//! and inbox with one script call each, all of them refused. (Its
//! hand-offs run `HANDOFFS_IN_FLIGHT` at a time, so those already sent when
//! the first refusal comes back are refused too, and no more are sent.)

use fred::interfaces::{ConfigInterface, SlowlogInterface, StreamsInterface};
use fred::types::SlowlogEntry;

use super::*;
use crate::cleanup::Claim;
use crate::membership::HANDOFFS_IN_FLIGHT;
use crate::store::records::job_owner;

/// The pool functions Redis ran since the slow log was reset, by name
/// (without the library's digest prefix).
async fn functions_called(client: &fred::prelude::Client) -> Vec<String> {
    let entries: Vec<SlowlogEntry> = client.slowlog_get(Some(-1)).await.unwrap();
    entries
        .into_iter()
        .filter_map(|entry| {
            let mut args = entry.args.into_iter().filter_map(|a| a.as_string());
            let command = args.next()?;
            let function = args.next()?;
            command
                .eq_ignore_ascii_case("fcall")
                .then(|| function.split_once('_').map(|(_, name)| name.to_string()))
                .flatten()
        })
        .collect()
}

/// Dispatches `jobs` keys that `a` places on worker `on`.
async fn jobs_placed_on(a: &Node, on: &str, jobs: usize) -> Vec<String> {
    let mut keys = Vec::new();
    for i in 0..10 * jobs {
        let key = format!("j{i}");
        if a.placement(&key).as_deref() == Some(on) {
            a.dispatch_job(&key, &b"p"[..]).await.unwrap();
            keys.push(key);
        }
        if keys.len() == jobs {
            break;
        }
    }
    assert_eq!(
        keys.len(),
        jobs,
        "{jobs} of {} keys placed on one of two workers",
        10 * jobs
    );
    keys
}

/// Runs `clean` with every function call logged; returns the pool
/// functions it called.
async fn calls_of(client: &fred::prelude::Client, clean: impl Future<Output = ()>) -> Vec<String> {
    let _: () = client.config_set("slowlog-max-len", 100_000).await.unwrap();
    let _: () = client
        .config_set("slowlog-log-slower-than", 0)
        .await
        .unwrap();
    client.slowlog_reset().await.unwrap();
    clean.await;
    let _: () = client
        .config_set("slowlog-log-slower-than", 10_000)
        .await
        .unwrap();
    functions_called(client).await
}

/// Asserts that the cleaner stopped at its first window of refused
/// hand-offs, and that `on` still owns every one of `keys`.
async fn stopped_at_first_refusal(
    client: &fred::prelude::Client,
    a: &Node,
    on: &str,
    keys: &[String],
    called: &[String],
) {
    let count = |name: &str| called.iter().filter(|f| f.as_str() == name).count();
    let handoffs = count("handoff");
    assert!(
        (1..=HANDOFFS_IN_FLIGHT).contains(&handoffs),
        "the hand-offs in flight at the first refusal, then the cleaner stops; \
         it called {handoffs} hand-offs for {} jobs: {called:?}",
        keys.len()
    );
    assert_eq!(
        count("move_entry") + count("remove_worker"),
        0,
        "the cleaner went on past the jobs: {called:?}"
    );
    let jobs_hash = a.inner.store.maps.jobs_map().keys_info().hash.clone();
    for key in keys {
        let record: Option<String> = client.hget(jobs_hash.as_str(), key.as_str()).await.unwrap();
        let record = record.unwrap_or_else(|| panic!("{key}: no record"));
        assert_eq!(job_owner(&record).map(|(w, _)| w), Some(on), "{key}");
    }
    assert!(a.pool_workers().iter().any(|w| w.id == on));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleaner_whose_claim_is_gone_stops_at_its_first_refused_step() {
    let server = RedisServer::start().unwrap();
    let (client, a, b, wa, _wb, _) = two_nodes(&server, "lost-claim").await;
    // Three windows of hand-offs in flight.
    let keys = jobs_placed_on(&a, wa.id(), 3 * HANDOFFS_IN_FLIGHT).await;

    // A live claim on `wa` that is not `b`'s: `b` took one, then `wa` came
    // back and cleared it and another node claimed it, or another node
    // took it over.
    let now_ms = crate::store::call::server_time_ms(&client).await.unwrap();
    a.inner
        .store
        .maps
        .cleanup
        .set(wa.id(), &format!("n-other {now_ms}"))
        .await
        .unwrap();

    let called = calls_of(&client, async {
        assert_eq!(b.inner.clean_worker(wa.id()).await.unwrap(), Claim::Lost);
    })
    .await;
    // Nothing of `wa` moved: it still owns every job and stays registered.
    stopped_at_first_refusal(&client, &a, wa.id(), &keys, &called).await;
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A cleanup under way when the pool starts recovering from a data loss or
/// a rollback (its claim made before): the older state may show jobs it
/// moved before Redis went back. It stops at its first refused step and
/// leaves its claim, for a takeover once the window is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_stops_at_its_first_step_refused_for_a_recovery() {
    let server = RedisServer::start().unwrap();
    let (client, a, b, wa, _wb, _) = two_nodes(&server, "paused-cleanup").await;
    let keys = jobs_placed_on(&a, wa.id(), 3 * HANDOFFS_IN_FLIGHT).await;
    let now_ms = crate::store::call::server_time_ms(&client).await.unwrap();
    let claim = format!("{} {now_ms}", b.inner.id);
    let cleanup = &a.inner.store.maps.cleanup;
    cleanup.set(wa.id(), &claim).await.unwrap();
    b.inner
        .store
        .begin_recovery(Duration::from_secs(5))
        .await
        .unwrap();

    let called = calls_of(&client, async {
        assert_eq!(b.inner.clean_worker(wa.id()).await.unwrap(), Claim::Paused);
    })
    .await;
    stopped_at_first_refusal(&client, &a, wa.id(), &keys, &called).await;
    let left: Option<String> = client
        .hget(cleanup.keys_info().hash.as_str(), wa.id())
        .await
        .unwrap();
    assert_eq!(left, Some(claim), "the claim stays for a takeover");
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// With no other worker to take a dead worker's inbox entry, a cleaner
/// drops it only while its claim holds: a worker that came back (and
/// cleared the claim) reads its own entries, a stop among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleaner_whose_claim_is_gone_drops_no_entry_of_a_lone_worker() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    // A client-only node: no worker but the one this test makes up.
    let a = Node::join(&client, "lost-claim-drop", NodeOptions::default())
        .await
        .unwrap();
    let lone = "w-lone";
    let inbox = a.inner.inbox(lone).unwrap();
    let mut ids = Vec::new();
    for key in ["k1", "k2"] {
        ids.push(inbox.add("start", start_entry(key, 7)).await.unwrap());
    }
    let now_ms = crate::store::call::server_time_ms(&client).await.unwrap();
    let claim = |node: &str| format!("{node} {now_ms}");
    let cleanup = &a.inner.store.maps.cleanup;
    cleanup.set(lone, &claim("n-other")).await.unwrap();

    let held = a
        .inner
        .requeue_worker_inbox(lone, Some(a.inner.id.as_str()), &mut Default::default())
        .await
        .unwrap();
    assert_eq!(held, Claim::Lost, "the claim is another node's");
    let left: Vec<(String, std::collections::HashMap<String, bytes::Bytes>)> =
        client.xrange(inbox.key(), "-", "+", None).await.unwrap();
    let left: Vec<String> = left.into_iter().map(|(id, _)| id).collect();
    assert_eq!(left, ids, "every entry stays for the worker");

    // With its own claim, the cleaner drops them (their guards and
    // payloads, if any, wait for the orphan sweep).
    cleanup.set(lone, &claim(&a.inner.id)).await.unwrap();
    let held = a
        .inner
        .requeue_worker_inbox(lone, Some(a.inner.id.as_str()), &mut Default::default())
        .await
        .unwrap();
    assert_eq!(held, Claim::Held);
    assert_eq!(inbox.len().await.unwrap(), 0, "dropped");
    a.close().await.unwrap();
}
