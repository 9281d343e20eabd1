//! poolctl's read commands against a live pool: the JSON values match what
//! the pool itself reports, text fits in 80 columns, and reading never
//! writes to Redis.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use flotilla_testkit::{command_stats, wait_until};
use fred::prelude::*;
use serde_json::Value;
use support::{LivePool, TTL, hex, initial_jobs, stdout};

fn strings(v: &Value, field: &str) -> BTreeSet<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x[field].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_reports_match_the_live_pool() {
    let live = LivePool::start("ctl-values").await;
    let node = &live.nodes[0];
    let worker_ids: BTreeSet<String> = live.workers.iter().map(|w| w.id().to_string()).collect();

    // workers
    let w = live.json(&["workers"]).await;
    assert_eq!(w["pool"], live.pool.as_str());
    assert_eq!(w["worker_ttl_ms"], TTL.as_millis() as u64);
    assert_eq!(strings(&w["workers"], "id"), worker_ids);
    let mut jobs_per_worker = HashMap::new();
    for key in node.job_keys() {
        let (owner, _) = node.job_owner(&key).unwrap();
        *jobs_per_worker.entry(owner).or_insert(0u64) += 1;
    }
    for row in w["workers"].as_array().unwrap() {
        let id = row["id"].as_str().unwrap();
        assert_eq!(row["state"], "active", "{row}");
        assert_eq!(row["pid"], std::process::id());
        assert_eq!(row["jobs"], jobs_per_worker.get(id).copied().unwrap_or(0));
        assert!(row["keepalive_age_ms"].as_u64().unwrap() <= TTL.as_millis() as u64);
        let info = node
            .pool_workers()
            .into_iter()
            .find(|i| i.id == id)
            .unwrap();
        assert_eq!(row["node"], info.node.as_str());
        assert_eq!(row["host"], info.host.as_str());
        assert_eq!(row["created_at_ms"], info.created_at_ms);
    }

    // nodes
    let n = live.json(&["nodes"]).await;
    let node_ids: BTreeSet<String> = live.nodes.iter().map(|n| n.id().to_string()).collect();
    assert_eq!(strings(&n["nodes"], "id"), node_ids);
    for row in n["nodes"].as_array().unwrap() {
        let id = row["id"].as_str().unwrap();
        let local = live.nodes.iter().find(|n| n.id() == id).unwrap();
        assert_eq!(row["workers"], local.workers().len() as u64);
    }

    // jobs, with filters
    let j = live.json(&["jobs"]).await;
    let expected: BTreeMap<String, Vec<u8>> = initial_jobs().into_iter().collect();
    assert_eq!(
        strings(&j["jobs"], "key"),
        expected.keys().cloned().collect::<BTreeSet<_>>()
    );
    for row in j["jobs"].as_array().unwrap() {
        let key = row["key"].as_str().unwrap();
        let (owner, token) = node.job_owner(key).unwrap();
        assert_eq!(row["owner"], owner.as_str());
        assert_eq!(row["token"], token);
        assert_eq!(row["payload_size"], expected[key].len() as u64);
        assert!(row["created_at_ms"].as_u64().unwrap() > 0);
    }
    let prefixed = live.json(&["jobs", "--prefix", "other-"]).await;
    assert_eq!(
        strings(&prefixed["jobs"], "key"),
        ["other-1", "other-2"].map(String::from).into()
    );
    let some_worker = node.job_owner("job-a").unwrap().0;
    let by_worker = live.json(&["jobs", "--worker", &some_worker]).await;
    let mine: BTreeSet<String> = node
        .job_keys()
        .into_iter()
        .filter(|k| node.job_owner(k).unwrap().0 == some_worker)
        .collect();
    assert_eq!(strings(&by_worker["jobs"], "key"), mine);

    // job KEY: binary and text payloads
    let c = live.json(&["job", "job-c"]).await;
    assert_eq!(c["state"], "running");
    assert_eq!(c["payload_hex"], hex(&expected["job-c"]));
    assert_eq!(c["payload_is_utf8"], false);
    assert_eq!(c["owner"], node.job_owner("job-c").unwrap().0.as_str());
    let b = live.json(&["job", "job-b"]).await;
    assert_eq!(b["payload_utf8"], "bravo payload");
    assert_eq!(b["payload_size"], 13);
    let missing = live.run(&["job", "no-such-job"]).await;
    assert_eq!(missing.status.code(), Some(1));

    // placement agrees with the nodes' own ring
    for key in ["job-a", "job-b", "brand-new-key"] {
        let p = live.json(&["placement", key]).await;
        assert_eq!(p["chosen"], node.placement(key).unwrap().as_str(), "{p}");
        let ranking = p["ranking"].as_array().unwrap();
        assert_eq!(ranking.len(), 3);
        assert_eq!(ranking[0]["worker"], p["chosen"]);
        assert!(ranking[0]["score"].as_u64() >= ranking[1]["score"].as_u64());
        if key.starts_with("job-") {
            assert_eq!(p["current_owner"], p["chosen"]);
        }
    }

    // locks: under the pool's tag, and among all locks
    let guard = live.guard.as_ref().unwrap();
    for args in [&["locks"][..], &["locks", "--pool", &live.pool][..]] {
        let l = live.json(args).await;
        let lock = l["locks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == "scheduler")
            .unwrap_or_else(|| panic!("no scheduler lock in {l}"))
            .clone();
        assert_eq!(lock["owner"], "test-owner");
        assert_eq!(lock["hash_tag"], live.pool.as_str());
        assert_eq!(lock["token"], guard.token());
        assert_eq!(lock["pid"], std::process::id());
        assert!(lock["ttl_remaining_ms"].as_u64().unwrap() > 60_000);
    }

    // streams: an inbox per worker that was sent a job (a stream exists
    // once an entry was added), a reply stream for the dispatching node
    let s = live.json(&["streams"]).await;
    let rows = s["streams"].as_array().unwrap();
    let inboxes: BTreeSet<String> = rows
        .iter()
        .filter(|r| r["kind"] == "inbox")
        .map(|r| r["owner"].as_str().unwrap().to_string())
        .collect();
    let owners: BTreeSet<String> = jobs_per_worker.keys().cloned().collect();
    assert!(inboxes.is_subset(&worker_ids), "{inboxes:?}");
    assert!(owners.is_subset(&inboxes), "{owners:?} vs {inboxes:?}");
    let replies: Vec<&Value> = rows.iter().filter(|r| r["kind"] == "replies").collect();
    assert_eq!(replies.len(), 1, "{s}");
    assert_eq!(replies[0]["owner"], node.id());
    let key = replies[0]["key"].as_str().unwrap();
    let xlen: u64 = live.direct.xlen(key).await.unwrap();
    assert_eq!(replies[0]["length"], xlen);

    // pending: a start held in the handler shows as a pending dispatch
    let slow = {
        let node = node.clone();
        tokio::spawn(async move { node.dispatch_job("slow-1", &b"zz"[..]).await })
    };
    wait_until(Duration::from_secs(10), "slow-1 pending", || {
        let fut = live.json(&["pending"]);
        async move {
            fut.await["pending"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
        }
    })
    .await
    .unwrap();
    // The handler holds the start until the gate opens: still pending.
    let pending = live.json(&["pending"]).await;
    let row = &pending["pending"][0];
    assert_eq!(row["key"], "slow-1");
    assert_eq!(row["dispatcher_node"], node.id());
    assert!(row["expires_in_ms"].as_i64().unwrap() > 0);
    let job = live.json(&["job", "slow-1"]).await;
    assert_eq!(job["state"], "pending");
    live.gate.send_replace(true);
    slow.await.unwrap().unwrap();

    // status and pools sum it up
    let st = live.json(&["status"]).await;
    assert_eq!(st["counts"]["workers"], 3);
    assert_eq!(st["counts"]["active_workers"], 3);
    assert_eq!(st["counts"]["nodes"], 2);
    assert_eq!(st["counts"]["jobs"], 6);
    assert_eq!(st["counts"]["pending"], 0);
    // The test's lock and the pool's sweeper lease, held by one of its nodes.
    assert_eq!(st["counts"]["locks"], 2);
    let l = live.json(&["locks", "--pool", &live.pool]).await;
    let sweeper = l["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "sweeper")
        .unwrap_or_else(|| panic!("no sweeper lease in {l}"));
    assert!(
        live.nodes.iter().any(|n| sweeper["owner"] == n.id()),
        "sweeper lease held by {}",
        sweeper["owner"]
    );
    assert_eq!(st["shutdown_requested_by"], Value::Null);
    let pools = live.json(&["pools"]).await;
    let me = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == live.pool.as_str())
        .unwrap()
        .clone();
    assert_eq!(
        (me["workers"].clone(), me["jobs"].clone()),
        (3.into(), 6.into())
    );

    // text output fits in 80 columns
    for cmd in [
        &["status"][..],
        &["workers"],
        &["nodes"],
        &["jobs"],
        &["pending"],
        &["locks"],
        &["streams"],
        &["pools"],
        &["job", "job-b"],
    ] {
        let out = live.run(cmd).await;
        assert!(out.status.success(), "{cmd:?}");
        let text = stdout(&out);
        assert!(!text.is_empty(), "{cmd:?} printed nothing");
        for line in text.lines() {
            assert!(
                line.chars().count() <= 80,
                "{cmd:?}: {line:?} is wider than 80"
            );
        }
    }
    let workers_text = stdout(&live.run(&["workers"]).await);
    assert!(workers_text.starts_with("WORKER"), "{workers_text}");
    assert!(workers_text.contains(" ago"), "{workers_text}");
    for node in &live.nodes {
        node.close().await.unwrap();
    }
}

/// Commands poolctl's read path may send: the read commands it uses, plus
/// fred's connection set-up (`PING`, `CLIENT ID`, `INFO` for the server
/// version). `info` is also this test's own probe.
const READ_ONLY: &[&str] = &[
    "hgetall",
    "hget",
    "hmget",
    "hlen",
    "scan",
    "xlen",
    "xinfo|stream",
    "xinfo|groups",
    "time",
    "pttl",
    "info",
    "ping",
    "client|id",
    "client|setname",
    "client|setinfo",
    "hello",
    "select",
];

/// Commands that change data, publish or join: none may appear.
const WRITES: &[&str] = &[
    "hset",
    "hdel",
    "hincrby",
    "xadd",
    "xdel",
    "xtrim",
    "set",
    "del",
    "unlink",
    "incr",
    "expire",
    "pexpire",
    "eval",
    "evalsha",
    "fcall",
    "function|load",
    "publish",
    "spublish",
    "subscribe",
    "ssubscribe",
    "script|load",
    "xgroup|create",
    "xreadgroup",
    "xread",
    "xack",
    "multi",
    "exec",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_commands_never_write() {
    let live = LivePool::start("ctl-readonly").await;
    // Quiesce the pool: every node, worker and lock client talks to Redis
    // through the proxy; cutting it closes their connections, so from now
    // on only this test's direct client and poolctl reach Redis.
    live.proxy.cut();
    wait_until(
        Duration::from_secs(10),
        "only the direct client left",
        || {
            let direct = live.direct.clone();
            async move {
                let list: String = direct
                    .custom(fred::cmd!("CLIENT"), vec!["LIST"])
                    .await
                    .unwrap();
                list.lines().count() == 1
            }
        },
    )
    .await
    .unwrap();
    let before: HashMap<String, u64> = command_stats(&live.direct)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let commands: &[&[&str]] = &[
        &["pools"],
        &["status"],
        &["nodes"],
        &["workers"],
        &["jobs"],
        &["jobs", "--prefix", "job-"],
        &["job", "job-c"],
        &["pending"],
        &["locks"],
        &["streams"],
        &["placement", "job-a"],
        &["watch", "--frames", "2", "--interval", "50ms"],
    ];
    for cmd in commands {
        for json in [false, true] {
            if json && cmd[0] == "watch" {
                continue;
            }
            let mut args = cmd.to_vec();
            if json {
                args.push("--json");
            }
            let out = live.run(&args).await;
            assert!(out.status.success(), "{args:?}: {}", support::stderr(&out));
        }
    }
    let after: HashMap<String, u64> = command_stats(&live.direct)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let mut delta = BTreeMap::new();
    for (cmd, calls) in &after {
        let added = calls - before.get(cmd).copied().unwrap_or(0);
        if added > 0 {
            delta.insert(cmd.clone(), added);
        }
    }
    println!("commands poolctl sent: {delta:?}");
    for w in WRITES {
        assert!(!delta.contains_key(*w), "poolctl sent {w}: {delta:?}");
    }
    let others: Vec<&String> = delta
        .keys()
        .filter(|c| !READ_ONLY.contains(&c.as_str()))
        .collect();
    assert!(
        others.is_empty(),
        "unexpected commands {others:?} in {delta:?}"
    );
    assert!(delta.get("hgetall").copied().unwrap_or(0) > 0, "{delta:?}");

    // With the pool cut off nobody renews: under a 1 ms TTL every worker
    // reads as stale (the state is judged on Redis server time).
    let mut args = vec![
        "--redis".to_string(),
        live.server.url(),
        "--pool".into(),
        live.pool.clone(),
    ];
    args.extend(["--worker-ttl", "1ms", "workers", "--json"].map(String::from));
    let out = support::poolctl(&args).await;
    let workers: Value = serde_json::from_slice(&out.stdout).unwrap();
    let states: BTreeSet<&str> = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["stale"].into());

    // Undecodable entries are reported, never fatal.
    let map_hash = |map| {
        flotilla_rmap::MapKeys::new(map, Some(&live.pool))
            .unwrap()
            .hash
    };
    let (jobs_hash, cleanup_hash) = (map_hash("jobs"), map_hash("cleanup"));
    let worker = workers["workers"][0]["id"].as_str().unwrap().to_string();
    let _: () = live
        .direct
        .hset(&jobs_hash, ("garbage-job", "no token here"))
        .await
        .unwrap();
    let _: () = live
        .direct
        .hset(&cleanup_hash, (worker.as_str(), "some-node 12345"))
        .await
        .unwrap();
    let status = live.json(&["status"]).await;
    let malformed = &status["malformed"];
    assert_eq!(malformed.as_array().unwrap().len(), 1, "{malformed}");
    assert_eq!(malformed[0]["map"], "jobs");
    assert_eq!(malformed[0]["field"], "garbage-job");
    assert_eq!(status["counts"]["cleaning_workers"], 1);
    assert_eq!(status["cleanups"][0]["node"], "some-node");
    assert_eq!(status["cleanups"][0]["claimed_at_ms"], 12345);
    // A worker being cleaned up leaves the ring.
    let p = live.json(&["placement", "job-a"]).await;
    assert_eq!(p["ranking"].as_array().unwrap().len(), 2);
    assert_eq!(p["excluded"][0]["worker"], worker.as_str());
    assert!(live.run(&["status"]).await.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_jobs_show_as_restarting_then_failed() {
    use flotilla_pool::{DispatchOptions, RestartPolicy};
    let live = LivePool::start("ctl-failing").await;
    let node = &live.nodes[0];
    let give_up =
        DispatchOptions::default().restart_policy(RestartPolicy::default().max_failures(1));
    let wait_long = DispatchOptions::default().restart_policy(
        RestartPolicy::default()
            .first_delay(Duration::from_secs(60))
            .max_delay(Duration::from_secs(60))
            .max_failures(3),
    );
    node.dispatch_job_with("fail-now", &b"x"[..], &give_up)
        .await
        .unwrap();
    node.dispatch_job_with("fail-later", &b"x"[..], &wait_long)
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(10),
        "both jobs recorded their failure",
        || async {
            let failed = live.json(&["job", "fail-now"]).await;
            let later = live.json(&["job", "fail-later"]).await;
            failed["state"] == "failed" && later["state"] == "restarting"
        },
    )
    .await
    .unwrap();
    let failed = live.json(&["job", "fail-now"]).await;
    assert_eq!(failed["failures"], 1);
    assert_eq!(failed["last_error"], "bad configuration");
    let later = live.json(&["job", "fail-later"]).await;
    assert_eq!(later["failures"], 1);
    assert!(later["failure_at_ms"].as_u64().unwrap() > 0);

    let jobs = live.json(&["jobs"]).await;
    let row = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == "fail-later")
        .unwrap()
        .clone();
    assert_eq!(row["state"], "restarting");
    assert_eq!(row["failures"], 1);
    assert_eq!(
        strings(&jobs["failed"], "key"),
        BTreeSet::from(["fail-now".to_string()])
    );
    let text = stdout(&live.run(&["jobs"]).await);
    assert!(
        text.contains("restarting") && text.contains("fail-now"),
        "{text}"
    );

    // A stop clears the failed job.
    node.stop_job("fail-now").await.unwrap();
    let jobs = live.json(&["jobs"]).await;
    assert!(jobs["failed"].as_array().unwrap().is_empty(), "{jobs}");
}
