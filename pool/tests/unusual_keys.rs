//! Job keys and payloads a caller may send, however odd: spaces, Lua
//! pattern characters, words the pool's scripts use themselves, numbers,
//! non-ASCII text, the longest key allowed, empty and binary payloads. Each
//! runs once, keeps its payload and its notifications, moves once when its
//! worker is cut off, and stops; names the pool cannot store are refused
//! with a typed error before anything reaches Redis.

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use flotilla_pool::{Error, Worker};
use support::{Env, Ledger, eventually, fast, victim};

/// Keys the scripts split, match or compare somewhere if they mishandled
/// them: separators of their records ("<worker> <token>", "stop <token>"),
/// Lua pattern characters, the names of the control fields (without their
/// control character), a number, non-ASCII text and the longest key.
fn unusual_keys() -> Vec<String> {
    let mut keys: Vec<String> = [
        "a b",
        " leading and trailing ",
        "stop 1 2",
        "w-1 17",
        "100%",
        "%d+ (.*)$",
        "[x]-y.*?^",
        "epoch",
        "recovering",
        "server",
        "0",
        "-1",
        "ключ/鍵/キー",
        "zero\u{200b}width",
        "quote\"and\\backslash",
        "a:b:c",
    ]
    .iter()
    .map(|k| k.to_string())
    .collect();
    keys.push("k".repeat(128));
    keys
}

/// A payload per key: empty, binary with zero bytes, or text.
fn payload(i: usize) -> Bytes {
    match i % 3 {
        0 => Bytes::new(),
        1 => Bytes::from(vec![0u8, 255, 0, 10, 13, b' ', 0]),
        _ => Bytes::from(format!("payload {i} with spaces\nand a newline")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusual_keys_and_payloads_run_once_move_once_and_stop() {
    let env = Env::new("odd-keys");
    let ledger = Ledger::default();
    let (proxy, doomed, victim) = victim(&env, &ledger).await;
    let node = env.node(fast()).await;
    let _survivor = Worker::new(&node, ledger.handler("survivor"))
        .await
        .unwrap();
    let keys = unusual_keys();

    for (i, key) in keys.iter().enumerate() {
        node.dispatch_job(key, payload(i)).await.unwrap();
        assert!(
            matches!(
                node.dispatch_job(key, payload(i)).await,
                Err(Error::JobExists(ref k)) if k == key
            ),
            "a second dispatch of {key:?} is refused as existing"
        );
        assert_eq!(node.job_payload(key).await.unwrap(), Some(payload(i)));
        node.notify_worker(key, key.as_bytes()).await.unwrap();
    }
    for key in &keys {
        assert_eq!(ledger.starts(key), 1, "{key:?} started once");
    }
    eventually(
        "every notification delivered",
        Duration::from_secs(5),
        || {
            let notes = ledger.notes();
            keys.iter()
                .all(|k| notes.iter().any(|(key, p)| key == k && p == k.as_bytes()))
        },
    )
    .await;

    // The victim's jobs go through the cleanup's scripts: each moves once,
    // with its payload.
    let on_victim = victim.job_keys();
    assert!(
        !on_victim.is_empty() && on_victim.len() < keys.len(),
        "both workers hold some of the keys: {} on the victim",
        on_victim.len()
    );
    let cut_at = Instant::now();
    proxy.cut();
    eventually(
        "the victim's jobs run on the survivor",
        Duration::from_secs(10),
        || {
            let running = ledger.running();
            on_victim
                .iter()
                .all(|k| running.get(k).is_some_and(|w| w == "survivor"))
        },
    )
    .await;
    println!(
        "{} unusual keys moved {:?} after the cut (TTL 1.5 s)",
        on_victim.len(),
        cut_at.elapsed()
    );
    for (i, key) in keys.iter().enumerate() {
        let expected = if on_victim.contains(key) { 2 } else { 1 };
        assert_eq!(ledger.starts(key), expected, "{key:?}");
        assert_eq!(node.job_payload(key).await.unwrap(), Some(payload(i)));
    }

    // Stops find each key, and a new dispatch of it starts it again.
    for (i, key) in keys.iter().enumerate() {
        node.stop_job(key).await.unwrap();
        assert!(!ledger.running().contains_key(key), "{key:?} stopped");
        assert!(matches!(
            node.stop_job(key).await,
            Err(Error::JobNotFound(ref k)) if k == key
        ));
        node.dispatch_job(key, payload(i + 1)).await.unwrap();
        assert_eq!(node.job_payload(key).await.unwrap(), Some(payload(i + 1)));
    }
    assert_eq!(ledger.running().len(), keys.len());
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    node.close().await.unwrap();
    drop(doomed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_the_pool_cannot_store_are_refused_with_a_typed_error() {
    let env = Env::new("bad-keys");
    let ledger = Ledger::default();
    let node = env.node(fast()).await;
    let _worker = Worker::new(&node, ledger.handler("w")).await.unwrap();
    let too_long = "k".repeat(129);
    for key in ["", "a{tag}", "new\nline", "tab\there", too_long.as_str()] {
        let refused = |result: Result<(), Error>, named: &str| matches!(result, Err(Error::InvalidName { what, .. }) if what == named);
        let job = "job key";
        assert!(
            refused(node.dispatch_job(key, &b"p"[..]).await, job),
            "{key:?}"
        );
        assert!(refused(node.stop_job(key).await, job), "{key:?}");
        assert!(
            refused(node.notify_worker(key, &b"n"[..]).await, job),
            "{key:?}"
        );
        let message = node.dispatch_message(key, &b"m"[..]).await;
        assert!(refused(message, "message key"), "{key:?}");
    }
    // Nothing reached a worker, and the pool still works.
    assert_eq!(ledger.total_starts(), 0);
    node.dispatch_job("fine", &b"p"[..]).await.unwrap();
    assert_eq!(ledger.starts("fine"), 1);
    node.close().await.unwrap();
}
