//! One script call for many items: a batch of start records or of
//! admissions is decided item by item, in order, as separate calls would.

use super::*;

/// One `record_starts.lua` call settles each start as its own call would,
/// in order: a start matching its guard is recorded, one with another
/// token is superseded, the same start again (a lost reply) is answered
/// `ok` again, a start by an unregistered worker is left for the cleaner;
/// each dispatcher gets one reply entry with a line per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_start_records_settles_each_start_in_order() {
    use crate::store::StartToRecord;
    use fred::prelude::StreamsInterface;
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("batch");
    let (node, worker, _handler) = pool(&server, &name).await;
    let inner = &node.inner;
    for (key, token) in [("b1", 11), ("b2", 22)] {
        inner
            .store
            .maps
            .pending_map()
            .set(key, &live_guard(token))
            .await
            .unwrap();
    }
    let inbox = inner.inbox(worker.id()).unwrap().key().to_string();
    let (to_x, to_y) = (
        inner.reply_key("n-x").unwrap(),
        inner.reply_key("n-y").unwrap(),
    );
    let start =
        |key: &str, token: u64, worker: &str, reply: Option<(&String, u64)>| StartToRecord {
            key: key.to_string(),
            token,
            worker: worker.to_string(),
            inbox: inbox.clone(),
            entry_id: format!("1-{token}"),
            reply: reply.map(|(s, r)| (s.clone(), r)),
            admitted: token,
        };
    let starts = [
        start("b1", 11, worker.id(), Some((&to_x, 101))),
        start("b2", 21, worker.id(), Some((&to_x, 102))),
        start("b1", 11, worker.id(), Some((&to_y, 103))),
        start("b3", 5, "w-unknown", Some((&to_y, 104))),
    ];
    let statuses = inner
        .store
        .record_starts(&starts, inner.options.worker_ttl)
        .await
        .unwrap();
    assert_eq!(statuses, ["ok", "superseded", "ok", "unregistered"]);
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let jobs_hash = inner.store.maps.jobs_map().keys_info().hash.clone();
    let pending_hash = inner.store.maps.pending_map().keys_info().hash.clone();
    let owner: Option<String> =
        fred::prelude::HashesInterface::hget(&client, jobs_hash.as_str(), "b1")
            .await
            .unwrap();
    assert_eq!(owner, Some(format!("{} 11", worker.id())));
    let guards: Vec<Option<String>> =
        fred::prelude::HashesInterface::hmget(&client, pending_hash.as_str(), vec!["b1", "b2"])
            .await
            .unwrap();
    assert_eq!(guards[0], None, "recorded start's guard cleared");
    assert!(guards[1].is_some(), "superseded start's guard kept");
    for (stream, lines) in [(&to_x, "101 ok\n102 superseded"), (&to_y, "103 ok")] {
        let entries: Vec<(String, std::collections::HashMap<String, String>)> = client
            .xrange(stream.as_str(), "-", "+", None)
            .await
            .unwrap();
        assert_eq!(entries.len(), 1, "one reply entry for {stream}");
        assert_eq!(entries[0].1.get("n").map(String::as_str), Some("replies"));
        assert_eq!(entries[0].1.get("p").map(String::as_str), Some(lines));
    }
    node.close().await.unwrap();
}

/// One `admit.lua` call decides each admission as its own call would, in
/// order: the first admission of a key is admitted, a second one finds it
/// pending, not started yet (I3), a retry of the first (a lost reply) gets its token again, and an
/// owner that is not registered is refused; the admitted job starts once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_admissions_decides_each_in_order() {
    use crate::store::{Admission, AdmitLimits, Admitted};
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("admitbatch");
    let (node, worker, handler) = pool(&server, &name).await;
    let inner = &node.inner;
    let limits = AdmitLimits {
        node: inner.id.clone(),
        max_queued: inner.options.max_queued_jobs,
        pending_ttl: inner.options.dispatch_timeout + inner.options.ack_grace,
        worker_ttl: inner.options.worker_ttl,
    };
    let admission = |key: &str, owner: &str, request: u64| Admission {
        key: key.to_string(),
        body: crate::codec::encode(&crate::codec::JobBody {
            key: key.to_string(),
            payload: b"p".to_vec(),
            restart: None,
        }),
        owner: owner.to_string(),
        inbox: inner.inbox(owner).unwrap().key().to_string(),
        request,
        window: None,
        schedule: None,
        started: None,
    };
    let batch = [
        admission("a1", worker.id(), 1),
        admission("a1", worker.id(), 2),
        admission("a1", worker.id(), 1),
        admission("a2", "w-gone", 3),
    ];
    let replies = inner.store.admit(&limits, &batch).await.unwrap();
    let statuses: Vec<&str> = replies.iter().map(Admitted::as_str).collect();
    assert_eq!(statuses, ["ok", "pending", "ok", "no_worker"]);
    let token = |i: usize| match replies[i] {
        Admitted::Ok { token } => Some(token),
        _ => None,
    };
    assert!(token(0).is_some());
    assert_eq!(token(0), token(2), "a retry gets the same token");
    wait_until(
        Duration::from_secs(10),
        "the admitted job started",
        || async { worker.job_token("a1") == token(0) },
    )
    .await
    .unwrap();
    assert_eq!(handler.starts.load(Ordering::SeqCst), 1);
    assert!(worker.job_token("a2").is_none());
    node.close().await.unwrap();
}
