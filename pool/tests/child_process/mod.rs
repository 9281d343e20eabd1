//! Runs one `#[ignore]`d test of the current test binary as a separate
//! process (a holder or leader that the parent then kills with SIGKILL).
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Environment variable carrying the Redis URL to a child.
pub const URL_VAR: &str = "FLOTILLA_TEST_CHILD_REDIS_URL";
/// Environment variable carrying the lock or lease name to a child.
pub const NAME_VAR: &str = "FLOTILLA_TEST_CHILD_NAME";

/// The child's settings, or `None` when the test runs on its own (e.g.
/// `cargo test -- --ignored`): the child test then does nothing.
pub fn child_settings() -> Option<(String, String)> {
    Some((std::env::var(URL_VAR).ok()?, std::env::var(NAME_VAR).ok()?))
}

/// Starts `test` of this binary in a child process and returns once it
/// printed `ready`; returns the child and its output from `ready` to the
/// end of that line (libtest prints "test name ... " before it).
pub async fn spawn(test: &str, url: &str, name: &str, ready: &str) -> (Child, String) {
    let exe = std::env::current_exe().expect("current test binary");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(URL_VAR, url)
        .env(NAME_VAR, name)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn child test process");
    let stdout = child.stdout.take().expect("child stdout");
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.expect("child output") {
            if let Some(at) = line.find(ready) {
                return line[at..].to_string();
            }
        }
        panic!("the child process ended before printing {ready:?}");
    })
    .await
    .expect("child ready in time");
    // Keep draining its output so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, line)
}

/// SIGKILL: no release, no goodbye.
pub async fn kill(child: &mut Child) {
    child.kill().await.expect("kill child");
}
