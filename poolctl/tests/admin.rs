//! poolctl's admin commands: refused without --yes, and acting on a live
//! pool with it (the dispatched job runs on the pool's own workers).

mod support;

use std::time::Duration;

use flotilla_testkit::wait_until;
use fred::prelude::*;
use support::{LivePool, stderr, stdout};

async fn pool_keys(live: &LivePool) -> Vec<String> {
    let (_, keys): (String, Vec<String>) = live
        .direct
        .scan_page("0", format!("fl:{{{}}}:*", live.pool), Some(10_000), None)
        .await
        .unwrap();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_commands_need_yes_and_act_on_the_pool() {
    let live = LivePool::start("ctl-admin").await;
    let node = live.nodes[0].clone();
    let dir = std::env::temp_dir().join(flotilla_testkit::unique_name("poolctl-admin"));
    std::fs::create_dir_all(&dir).unwrap();
    let payload_file = dir.join("payload.bin");
    std::fs::write(&payload_file, b"from poolctl \x00\x01").unwrap();
    let note_file = dir.join("note.txt");
    std::fs::write(&note_file, b"refresh now").unwrap();
    let payload_arg = payload_file.to_str().unwrap();

    // Without --yes: exit 2, a clear message, and nothing happens.
    for cmd in [
        &["dispatch", "ctl-job", "--payload-file", payload_arg][..],
        &["stop", "job-a"],
        &["notify", "job-a"],
        &["shutdown"],
        &["drain", "w"],
        &["undrain", "w"],
        &["remove-worker", "w"],
    ] {
        let out = live.run(cmd).await;
        assert_eq!(out.status.code(), Some(2), "{cmd:?}");
        assert!(
            stderr(&out).contains("without --yes"),
            "{cmd:?}: {}",
            stderr(&out)
        );
    }
    let jobs = live.json(&["jobs"]).await;
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 5);
    assert!(live.seen.lock().unwrap().running.contains_key("job-a"));
    assert!(live.seen.lock().unwrap().notes.is_empty());

    // dispatch --yes: the job runs on a live worker with the file's bytes.
    let out = live
        .run(&[
            "dispatch",
            "ctl-job",
            "--payload-file",
            payload_arg,
            "--yes",
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("dispatched"), "{}", stdout(&out));
    let (worker, payload) = live.seen.lock().unwrap().running["ctl-job"].clone();
    assert_eq!(&payload[..], b"from poolctl \x00\x01");
    wait_until(Duration::from_secs(5), "node sees ctl-job", || {
        let owner = node.job_owner("ctl-job");
        let expected = worker.clone();
        async move { owner.is_some_and(|(w, _)| w == expected) }
    })
    .await
    .unwrap();
    let again = live.run(&["dispatch", "ctl-job", "--yes"]).await;
    assert_eq!(again.status.code(), Some(1), "a second dispatch is refused");
    assert!(
        stderr(&again).contains("already exists"),
        "{}",
        stderr(&again)
    );

    // notify --yes reaches the owner's handler.
    let out = live
        .run(&[
            "notify",
            "ctl-job",
            "--payload-file",
            note_file.to_str().unwrap(),
            "--yes",
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    wait_until(Duration::from_secs(5), "note delivered", || {
        let got = live.seen.lock().unwrap().notes.clone();
        async move {
            got.iter()
                .any(|(k, p)| k == "ctl-job" && &p[..] == b"refresh now")
        }
    })
    .await
    .unwrap();

    // stop --yes stops it; stopping a missing job is an error (exit 1).
    let out = live.run(&["stop", "ctl-job", "--yes"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!live.seen.lock().unwrap().running.contains_key("ctl-job"));
    let missing = live.run(&["stop", "no-such-job", "--yes"]).await;
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).contains("not found"),
        "{}",
        stderr(&missing)
    );

    // An unreadable payload file changes nothing.
    let bad = live
        .run(&[
            "dispatch",
            "x",
            "--payload-file",
            "/nonexistent/file",
            "--yes",
        ])
        .await;
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        stderr(&bad).contains("/nonexistent/file"),
        "{}",
        stderr(&bad)
    );

    // shutdown --yes stops every job and deletes the pool's keys.
    assert!(!pool_keys(&live).await.is_empty());
    let out = live.run(&["shutdown", "--timeout", "10s", "--yes"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    wait_until(Duration::from_secs(10), "every job stopped", || {
        let empty = live.seen.lock().unwrap().running.is_empty();
        async move { empty }
    })
    .await
    .unwrap();
    wait_until(Duration::from_secs(10), "pool keys deleted", || async {
        pool_keys(&live).await.is_empty()
    })
    .await
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_undrain_and_remove_worker_act_on_any_worker() {
    let live = LivePool::start("ctl-drain").await;
    let drained = live.workers[2].id().to_string();

    let out = live.run(&["drain", &drained, "--yes"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("drained"), "{}", stdout(&out));
    wait_until(Duration::from_secs(10), "its jobs moved", || {
        let (live, drained) = (&live, &drained);
        async move {
            let seen = live.seen.lock().unwrap();
            seen.running.len() == 5 && seen.running.values().all(|(w, _)| w != drained)
        }
    })
    .await
    .unwrap();
    let workers = live.json(&["workers"]).await;
    let row = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == drained.as_str())
        .cloned()
        .unwrap();
    assert_eq!(row["state"], "drained");
    let table = live.run(&["workers"]).await;
    assert!(stdout(&table).contains("drained"), "{}", stdout(&table));
    let out = live.run(&["undrain", &drained, "--yes"]).await;
    assert!(out.status.success(), "{}", stderr(&out));

    // A live worker is not removed; an unknown one is an error.
    let out = live.run(&["remove-worker", &drained, "--yes"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("is alive"), "{}", stderr(&out));
    let out = live.run(&["drain", "no-such-worker", "--yes"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no worker"), "{}", stderr(&out));
    // Undrained, it takes some back: every job runs once moves settle.
    wait_until(Duration::from_secs(10), "all five jobs run", || {
        let n = live.seen.lock().unwrap().running.len();
        async move { n == 5 }
    })
    .await
    .unwrap();
}
