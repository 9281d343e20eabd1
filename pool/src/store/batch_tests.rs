//! The batched scripts (`admit.lua`, `record_starts.lua`) write, for each
//! item of a batch, the records it would write alone, in the formats
//! other nodes, poolctl and the dashboard read; and the queue limit counts
//! the entries a batch adds itself.

use super::*;
use crate::codec::StartEntry;

/// The stored payload, start entry and fencing counter of `key`, and its
/// pending guard.
async fn written(f: &Fixture, key: &str, owner: &str) -> (Bytes, StartEntry, String, String) {
    let stored = f.store.payload(key).await.unwrap().expect("payload");
    let entries: Vec<(String, HashMap<String, Bytes>)> = f
        .store
        .client
        .xrange(f.inbox(owner), "-", "+", None)
        .await
        .unwrap();
    let entry = entries
        .into_iter()
        .map(|(_, fields)| StartEntry::parse(&fields["p"]).unwrap())
        .find(|e| e.body.key == key)
        .expect("start entry");
    let fencing: String = f
        .store
        .client
        .hget(keys::fencing(&f.store.pool), key)
        .await
        .unwrap();
    let guard = f.store.job_records(key).await.unwrap().2.expect("guard");
    (stored, entry, fencing, guard)
}

#[tokio::test]
async fn a_batch_writes_each_admission_s_records_in_their_formats() {
    let f = &fixture().await;
    f.register("w1").await;
    f.register("w2").await;
    let windowed = Admission {
        window: Some((keys::dispatched(&f.store.pool, "b3"), 60_000)),
        ..f.admission("b3", "w1", 13)
    };
    let batch = [
        f.admission("b1", "w1", 11),
        f.admission("b2", "w2", 12),
        windowed,
    ];
    let replies = f.store.admit(&f.limits(), &batch).await.unwrap();
    for (admission, reply) in batch.iter().zip(&replies) {
        let Admitted::Ok { token } = *reply else {
            panic!("{} not admitted: {reply:?}", admission.key);
        };
        let (stored, entry, fencing, guard) = written(f, &admission.key, &admission.owner).await;
        // Payload: "<admitted> <body>", the stamp the admission's token.
        let (admitted, body) = codec::parse_stored(&stored).unwrap();
        assert_eq!(codec::encode(&body), admission.body);
        assert_eq!(admitted, token);
        // Start entry: "<token> <admitted> 0 <request> <node>\n<body>".
        assert_eq!(
            (entry.token, entry.admitted, entry.hops),
            (token, admitted, 0)
        );
        let reply_to = entry.reply.expect("a dispatcher waits");
        assert_eq!(
            (reply_to.node.as_str(), reply_to.request),
            ("n-test", admission.request)
        );
        assert_eq!(entry.raw_body, admission.body);
        // Fencing counter: the token; guard "<token> <deadline_ms> <node>/<request>".
        assert_eq!(fencing, token.to_string());
        let deadline = codec::stamp_ms(admitted) + TTL.as_millis() as u64;
        assert_eq!(
            guard,
            format!("{token} {deadline} n-test/{}", admission.request)
        );
    }
    // The windowed admission's marker: "<admitted_ms> <token>".
    let marker: String = f
        .store
        .client
        .get(keys::dispatched(&f.store.pool, "b3"))
        .await
        .unwrap();
    let Admitted::Ok { token } = replies[2] else {
        unreachable!()
    };
    assert!(marker.ends_with(&format!(" {token}")), "{marker}");
    // A retry of the whole batch (lost reply) gets the same tokens.
    assert_eq!(
        f.store.admit(&f.limits(), &batch).await.unwrap(),
        replies,
        "retry"
    );
}

#[tokio::test]
async fn the_queue_limit_counts_the_entries_a_batch_adds() {
    let f = &fixture().await;
    f.register("w1").await;
    f.register("w2").await;
    let limits = AdmitLimits {
        max_queued: 2,
        ..f.limits()
    };
    f.admitted("q1", "w1").await;
    let batch = [
        f.admission("q2", "w1", 2),
        f.admission("q3", "w1", 3),
        f.admission("q4", "w2", 4),
        f.admission("q5", "w2", 5),
        f.admission("q6", "w2", 6),
    ];
    let replies = f.store.admit(&limits, &batch).await.unwrap();
    let words: Vec<&str> = replies.iter().map(Admitted::as_str).collect();
    assert_eq!(words, ["ok", "full", "ok", "ok", "full"]);
    assert_eq!(replies[1], Admitted::Full(2));
    assert_eq!(replies[4], Admitted::Full(2));
    assert_eq!(f.entry_ids("w1").await.len(), 2);
    assert_eq!(f.entry_ids("w2").await.len(), 2);
    for refused in ["q3", "q6"] {
        assert_eq!(f.store.payload(refused).await.unwrap(), None, "{refused}");
    }
}

#[tokio::test]
async fn a_batch_of_starts_records_each_and_answers_in_one_entry_per_reply_stream() {
    let f = &fixture().await;
    f.register("w1").await;
    f.register("w2").await;
    let t1 = f.admitted("s1", "w1").await;
    let t2 = f.admitted("s2", "w2").await;
    let t3 = f.admitted("s3", "w2").await;
    let options = StreamOptions::default().hash_tag(&*f.store.pool);
    let replies = Stream::new(&f.store.client, &keys::node_replies("n-test"), options)
        .unwrap()
        .key()
        .to_string();
    let (ids1, ids2) = (f.entry_ids("w1").await, f.entry_ids("w2").await);
    let answered = |start: StartToRecord, request| StartToRecord {
        reply: Some((replies.clone(), request)),
        ..start
    };
    let batch = [
        answered(f.start("s1", t1, "w1", &ids1[0]), 21),
        f.start("s2", t2, "w2", &ids2[0]),
        answered(f.start("s3", t3 - 1, "w2", &ids2[1]), 23),
    ];
    assert_eq!(
        f.store.record_starts(&batch, TTL).await.unwrap(),
        [StartKept::Ok, StartKept::Ok, StartKept::Superseded]
    );
    // Ownership "<worker> <token>", guard cleared, entries removed.
    for (key, owner) in [("s1", format!("w1 {t1}")), ("s2", format!("w2 {t2}"))] {
        let (_, job, guard) = f.store.job_records(key).await.unwrap();
        assert_eq!(
            (job.as_deref(), guard),
            (Some(owner.as_str()), None),
            "{key}"
        );
    }
    let (_, job, guard) = f.store.job_records("s3").await.unwrap();
    assert_eq!(job, None, "a superseded start records nothing");
    assert!(guard.is_some(), "its guard stays for the newer start");
    assert!(f.entry_ids("w1").await.is_empty());
    assert!(f.entry_ids("w2").await.is_empty());
    // One replies entry: one "<request> <status>" line per answered start.
    let entries: Vec<(String, HashMap<String, String>)> = f
        .store
        .client
        .xrange(&replies, "-", "+", None)
        .await
        .unwrap();
    assert_eq!(entries.len(), 1);
    let fields = &entries[0].1;
    assert_eq!(fields["n"], codec::EV_REPLIES);
    assert_eq!(fields["p"], "21 ok\n23 superseded");
    // A retry after a lost reply gets the same answers.
    assert_eq!(
        f.store.record_starts(&batch[..2], TTL).await.unwrap(),
        [StartKept::Ok, StartKept::Ok]
    );
}
