//! A cleaner that finds its claim on a worker gone (the worker came back
//! and cleared it, or another node took it over) stops at that step: it
//! moves nothing more of the worker, and does not walk the rest of the
//! worker's jobs and inbox with one script call each, all of them refused.

use fred::types::{CustomCommand, Value};

use super::*;
use crate::store::records::job_owner;

/// The pool functions Redis ran since the slow log was reset, by name
/// (without the library's digest prefix).
async fn functions_called(client: &fred::prelude::Client) -> Vec<String> {
    let entries: Value = client
        .custom(
            CustomCommand::new_static("SLOWLOG", None, false),
            vec!["GET", "-1"],
        )
        .await
        .unwrap();
    let mut names = Vec::new();
    for entry in entries.into_array() {
        let fields = entry.into_array();
        let Some(args) = fields.get(3) else { continue };
        let args: Vec<String> = args
            .clone()
            .into_array()
            .into_iter()
            .filter_map(|a| a.as_string())
            .collect();
        if args
            .first()
            .is_some_and(|c| c.eq_ignore_ascii_case("fcall"))
            && let Some((_, name)) = args.get(1).and_then(|f| f.split_once('_'))
        {
            names.push(name.to_string());
        }
    }
    names
}

async fn config_set(client: &fred::prelude::Client, name: &str, value: &str) {
    let _: Value = client
        .custom(
            CustomCommand::new_static("CONFIG", None, false),
            vec!["SET", name, value],
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleaner_whose_claim_is_gone_stops_at_its_first_refused_step() {
    let server = RedisServer::start().unwrap();
    let (client, a, b, wa, _wb, _) = two_nodes(&server, "lost-claim").await;
    let mut keys = Vec::new();
    for i in 0..400 {
        let key = format!("j{i}");
        if a.placement(&key).as_deref() == Some(wa.id()) {
            a.dispatch_job(&key, &b"p"[..]).await.unwrap();
            keys.push(key);
        }
        if keys.len() == 40 {
            break;
        }
    }
    assert_eq!(
        keys.len(),
        40,
        "40 of 400 keys placed on one of two workers"
    );

    // A live claim on `wa` that is not `b`'s: `b` took one, then `wa` came
    // back and cleared it and another node claimed it, or another node
    // took it over.
    let (secs, micros): (u64, u64) = client
        .custom(
            CustomCommand::new_static("TIME", None, false),
            Vec::<String>::new(),
        )
        .await
        .unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    a.inner
        .store
        .maps
        .cleanup
        .set(wa.id(), &format!("n-other {now_ms}"))
        .await
        .unwrap();

    config_set(&client, "slowlog-max-len", "100000").await;
    config_set(&client, "slowlog-log-slower-than", "0").await;
    let _: Value = client
        .custom(
            CustomCommand::new_static("SLOWLOG", None, false),
            vec!["RESET"],
        )
        .await
        .unwrap();
    b.inner.clean_worker(wa.id()).await.unwrap();
    config_set(&client, "slowlog-log-slower-than", "10000").await;

    let called = functions_called(&client).await;
    let steps = called
        .iter()
        .filter(|f| matches!(f.as_str(), "handoff" | "move_entry" | "remove_worker"))
        .count();
    assert_eq!(
        steps, 1,
        "one refused step, then the cleaner stops; it called: {called:?}"
    );
    // Nothing of `wa` moved: it still owns every job and stays registered.
    let jobs_hash = a.inner.store.maps.jobs_map().keys_info().hash.clone();
    for key in &keys {
        let record: Option<String> = client.hget(jobs_hash.as_str(), key.as_str()).await.unwrap();
        let record = record.unwrap_or_else(|| panic!("{key}: no record"));
        assert_eq!(job_owner(&record).map(|(w, _)| w), Some(wa.id()), "{key}");
    }
    assert!(a.pool_workers().iter().any(|w| w.id == wa.id()));
    a.close().await.unwrap();
    b.close().await.unwrap();
}
