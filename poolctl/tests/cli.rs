//! poolctl's exit codes and messages, and `watch --frames`.

mod support;

use std::time::Duration;

use support::{LivePool, poolctl, stderr, stdout};
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test]
async fn usage_errors_exit_2() {
    for args in [
        &[][..],
        &["no-such-command"],
        &["workers"],
        &["status", "--worker-ttl", "soon"],
        &["job"],
        &["--pool", "p", "watch"],
        &["--pool", "p", "dispatch", "k"],
        &[
            "--redis",
            "redis://127.0.0.1:1",
            "--tls-ca",
            "ca.pem",
            "pools",
        ],
        &["--redis", "not a url", "pools"],
    ] {
        let out = poolctl(args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).is_empty(), "{args:?} explained nothing");
    }
    let out = poolctl(&["workers"]).await;
    assert!(stderr(&out).contains("--pool"), "{}", stderr(&out));
    let out = poolctl(&["--pool", "p", "watch"]).await;
    assert!(stderr(&out).contains("--frames"), "{}", stderr(&out));
    let help = poolctl(&["--help"]).await;
    assert_eq!(help.status.code(), Some(0));
    for line in stdout(&help).lines() {
        assert!(line.chars().count() <= 80, "help line too wide: {line:?}");
    }
}

#[tokio::test]
async fn unreachable_redis_exits_1_with_a_clear_message() {
    let port = flotilla_testkit::free_port().unwrap();
    let url = format!("redis://alice:s3cret@127.0.0.1:{port}");
    let started = std::time::Instant::now();
    let out = poolctl(&["--redis", &url, "--pool", "p", "status"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "cannot reach Redis at redis://alice:***@127.0.0.1:{port}"
        )),
        "{err}"
    );
    assert!(err.contains("refused"), "{err}");
    assert!(!err.contains("s3cret"), "password leaked: {err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let out = poolctl(&["--redis", &url, "--pool", "p", "dispatch", "k", "--yes"]).await;
    assert_eq!(out.status.code(), Some(1));
}

/// `rediss://` with `--tls-ca` reads a pool over TLS; without the CA the
/// server's certificate is not trusted and poolctl says so (exit 1).
#[tokio::test]
async fn reads_over_tls_with_the_servers_ca() {
    let server = flotilla_testkit::RedisServer::start_with(
        flotilla_testkit::ServerOptions::default().tls(true),
    )
    .unwrap();
    let url = server.tls_url().unwrap();
    let ca = server.tls_ca_file().unwrap();
    let ca = ca.to_str().unwrap();
    let out = poolctl(&["--redis", &url, "--tls-ca", ca, "pools", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let pools: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(pools.is_array() || pools.is_object(), "{pools}");
    let out = poolctl(&["--redis", &url, "pools"]).await;
    assert_eq!(out.status.code(), Some(1), "untrusted certificate accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_renders_frames_without_a_terminal() {
    let live = LivePool::start("ctl-watch").await;
    // Without a terminal and without --frames: a usage error.
    let out = live.run(&["watch"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--frames"), "{}", stderr(&out));

    let mut args = live.args();
    args.extend(
        [
            "watch",
            "--frames",
            "2",
            "--interval",
            "3s",
            "--width",
            "80",
            "--height",
            "20",
        ]
        .map(String::from),
    );
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolctl"))
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut frames: Vec<Vec<String>> = Vec::new();
    let mut dispatched = false;
    while let Some(line) = lines.next_line().await.unwrap() {
        if line.starts_with("frame ") {
            frames.push(Vec::new());
            continue;
        }
        frames.last_mut().expect("a frame header first").push(line);
        if !dispatched && frames.len() == 1 && frames[0].len() == 20 {
            // Frame 1 is out; frame 2 is read after the 3 s interval.
            live.nodes[0]
                .dispatch_job("late-job", &b""[..])
                .await
                .unwrap();
            dispatched = true;
        }
    }
    assert!(child.wait().await.unwrap().success());
    assert_eq!(frames.len(), 2);
    for frame in &frames {
        assert_eq!(frame.len(), 20, "{frame:#?}");
        assert!(frame.iter().all(|l| l.chars().count() <= 80));
        let text = frame.join("\n");
        assert!(text.contains(&live.pool), "{text}");
        assert!(text.contains("workers 3 (3 active"), "{text}");
        assert!(text.contains('█'), "job bars: {text}");
        assert!(text.contains("scheduler held by test-owner"), "{text}");
    }
    assert!(frames[0].join("\n").contains("jobs 5"));
    assert!(frames[1].join("\n").contains("jobs 6"), "{:#?}", frames[1]);
}
