//! Dev-only support for Flotilla's tests, examples, benchmarks and demo.
//!
//! * [`RedisServer`] starts a private `redis-server` on a free loopback port
//!   (persistence off, or AOF on request), can kill and restart it on the same
//!   port and data directory, roll it back to a saved snapshot (lost
//!   writes, as after a replica promotion), make it refuse writes or drop
//!   every client's connection while it keeps running, and kills it on
//!   drop; with [`ServerOptions::clock_shift`] its wall clock can be
//!   stepped while it runs ([`RedisServer::shift_clock`]).
//! * [`Sentinels`] starts a primary, a replica and three Sentinels, and
//!   kills the primary so that Sentinel promotes the replica.
//! * [`FaultProxy`] sits between a client and Redis and can cut, heal or
//!   black-hole the connection.
//! * [`client`] and [`redis_for_example`] hand out connected fred clients.
//! * [`wait_until`] waits for a condition with a deadline (never
//!   sleep-and-hope).
//! * With `FLOTILLA_KEEP_LOGS=<dir>` ([`KEEP_LOGS_ENV`]) every server and
//!   Sentinel copies its log files into `<dir>` before its temporary
//!   directory goes, and the servers log at `notice`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), flotilla_testkit::Error> {
//! let server = flotilla_testkit::RedisServer::start()?;
//! let client = flotilla_testkit::client(&server.url()).await?;
//! # drop(client); Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod clock_shift;
mod kept_logs;
mod ports;
mod proxy;
mod refusal;
mod rollback;
mod sentinel;
mod server;
mod tls;

use std::future::Future;
use std::time::Duration;

use fred::prelude::*;

pub use kept_logs::KEEP_LOGS_ENV;
pub use proxy::{FaultProxy, ProxyMode};
pub use refusal::WriteRefusal;
pub use rollback::RedisSnapshot;
pub use sentinel::{SERVICE_NAME, SentinelOptions, Sentinels, sentinel_binary};
pub use server::{RedisServer, ServerOptions, free_port, redis_server_binary};

/// Errors of the test support crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `redis-server` is not installed.
    #[error(
        "redis-server was not found on PATH. Install it (Debian/Ubuntu: `sudo apt-get install -y redis-server`; \
         macOS: `brew install redis`) or set REDIS_SERVER_BIN to its path; or set REDIS_URL to use a running server \
         where supported"
    )]
    RedisServerMissing,
    /// The server could not be started or did not answer.
    #[error("could not start redis-server: {0}")]
    Startup(String),
    /// A client could not connect.
    #[error("redis client error: {0}")]
    Redis(#[from] fred::error::Error),
    /// A condition was not met before its deadline.
    #[error("timed out after {0:?} waiting for: {1}")]
    Timeout(Duration, String),
}

/// Builds and connects a fred client for `url` with the settings Flotilla's
/// tests use: exponential reconnect (10 ms … 100 ms, forever), 5 s command
/// timeout, 2 s connect timeout.
///
/// The pauses stay short because tests run pools with worker TTLs of a
/// second or less and restart Redis under them: a pause grown to a second
/// would keep a node off a restarted server past its lease (see
/// `flotilla_pool::reconnect_policy`, a quarter of the TTL at most).
///
/// # Errors
/// [`Error::Redis`] when the URL is bad or the server does not answer.
pub async fn client(url: &str) -> Result<Client, Error> {
    let client = builder(url)?.build()?;
    client.init().await?;
    Ok(client)
}

/// A fred builder with the test settings of [`client`], not yet built. For
/// the `rediss://` URL of a private TLS server ([`ServerOptions::tls`]) it
/// trusts that server's self-signed certificate.
///
/// # Errors
/// [`Error::Redis`] when the URL is bad.
pub fn builder(url: &str) -> Result<Builder, Error> {
    let mut config = Config::from_url(url)?;
    if let ServerConfig::Centralized { server } = &config.server
        && (url.starts_with("rediss://") || url.starts_with("valkeys://"))
        && let Some(tls) = tls::config_for_port(server.port)?
    {
        // A private TLS server: trust its self-signed certificate.
        config.tls = Some(tls);
    }
    let mut builder = Builder::from_config(config);
    builder
        .set_policy(ReconnectPolicy::new_exponential(0, 10, 100, 2))
        .with_connection_config(|c| {
            c.connection_timeout = Duration::from_secs(2);
            c.internal_command_timeout = Duration::from_secs(2);
            c.max_command_attempts = 3;
            // As `flotilla_pool::client_builder` does (TCP_NODELAY).
            c.tcp.nodelay = Some(true);
        })
        .with_performance_config(|p| {
            p.default_command_timeout = Duration::from_secs(5);
            p.broadcast_channel_capacity = 4096;
        });
    Ok(builder)
}

/// Redis for an example or the demo: the server named by `REDIS_URL` when set,
/// otherwise a private one started here (kept alive by the returned guard).
///
/// # Errors
/// [`Error::RedisServerMissing`] when `REDIS_URL` is unset and
/// `redis-server` is not installed.
pub fn redis_for_example() -> Result<(String, Option<RedisServer>), Error> {
    match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => Ok((url, None)),
        _ => {
            let server = RedisServer::start()?;
            Ok((server.url(), Some(server)))
        }
    }
}

/// Polls `check` every 10 ms until it returns `true` or `deadline` passes.
///
/// # Errors
/// [`Error::Timeout`] naming `what` when the deadline passes.
pub async fn wait_until<F, Fut>(deadline: Duration, what: &str, mut check: F) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + deadline;
    loop {
        if check().await {
            return Ok(());
        }
        if tokio::time::Instant::now() >= end {
            return Err(Error::Timeout(deadline, what.to_string()));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reads `INFO commandstats` into `(command, calls)` pairs, lower-case
/// command names (e.g. `evalsha`, `xadd`).
///
/// # Errors
/// [`Error::Redis`] when the server does not answer.
pub async fn command_stats(client: &Client) -> Result<Vec<(String, u64)>, Error> {
    let info: String = client
        .info(Some(fred::types::InfoKind::CommandStats))
        .await?;
    let mut out = Vec::new();
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let calls = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        out.push((name.to_string(), calls));
    }
    Ok(out)
}

/// A test-unique name: `prefix` plus a counter and the process id, so tests
/// sharing one server never collide.
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
