//! A running `poolctl serve` for the dashboard tests, and an HTTP client.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The admin token the tests start a dashboard with.
pub const TOKEN: &str = "t0ken-for-tests";

/// A `poolctl serve` child process on a free loopback port; killed on drop.
pub struct Dashboard {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    pub http: reqwest::Client,
}

impl Dashboard {
    /// Starts `poolctl serve` for `pool` (worker TTL 6 s, like `LivePool`),
    /// with `--admin-token TOKEN` when `admin`; returns once it listens.
    pub async fn start(redis_url: &str, pool: &str, admin: bool) -> Dashboard {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_poolctl"));
        cmd.args(["--redis", redis_url, "--pool", pool, "--worker-ttl", "6s"])
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env_remove("POOLCTL_ADMIN_TOKEN")
            .env("POOLCTL_LOG", "poolctl=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if admin {
            cmd.args(["--admin-token", TOKEN]);
        }
        let mut child = cmd.spawn().expect("poolctl serve starts");
        let stdout = child.stdout.take().expect("stdout piped");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("poolctl serve prints its address within 30 s")
            .expect("stdout readable")
            .expect("poolctl serve printed a line");
        let base = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Dashboard {
            child,
            base,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        }
    }

    /// The full URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// GET `path`: status and body text.
    pub async fn get(&self, path: &str) -> (u16, String) {
        let r = self.http.get(self.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.text().await.unwrap())
    }

    /// GET `path`, which must answer 200 with JSON.
    pub async fn json(&self, path: &str) -> serde_json::Value {
        let (status, body) = self.get(path).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: bad JSON ({e}): {body}"))
    }

    /// GET `path` with its duration.
    pub async fn timed(&self, path: &str) -> (u16, String, Duration) {
        let started = Instant::now();
        let (status, body) = self.get(path).await;
        (status, body, started.elapsed())
    }

    /// POST `path` with an optional `Authorization` header value.
    pub async fn post(&self, path: &str, auth: Option<&str>, body: &[u8]) -> reqwest::Response {
        let mut req = self.http.post(self.url(path)).body(body.to_vec());
        if let Some(a) = auth {
            req = req.header("Authorization", a);
        }
        req.send().await.unwrap()
    }

    /// Whether the child still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

/// `Bearer TOKEN`.
pub fn bearer() -> String {
    format!("Bearer {TOKEN}")
}
