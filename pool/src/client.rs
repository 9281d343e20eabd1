//! Building and checking fred clients: the settings [`Node::connect`]
//! uses ([`client_builder`]), the checks [`Node::join`] runs on a client it
//! is handed, and connection errors that name the address.
//!
//! [`Node::connect`]: crate::Node::connect
//! [`Node::join`]: crate::Node::join

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use fred::prelude::*;
use fred::socket2::TcpKeepalive;
use fred::types::config::{ServerConfig, UnresponsiveConfig};

use crate::error::{Error, Result};
use crate::options::NodeOptions;

/// The crate feature that turns TLS (`rediss://`) on.
pub const TLS_FEATURE: &str = "tls";

/// Longest `XREAD BLOCK` a node issues; a connection silent for longer than
/// this plus `redis_timeout` is taken for dead.
const LONGEST_BLOCK: Duration = Duration::from_secs(5);

/// A fred [`Builder`] for `url` with the settings [`Node::connect`](crate::Node::connect) uses,
/// for callers that need to adjust it (a private CA, a credential
/// provider) before building, connecting and passing the client to
/// [`Node::join`](crate::Node::join): reconnect forever with [`reconnect_policy`] (exponential,
/// 10 ms up to the smaller of 1 s and a tenth of the worker TTL); connection,
/// internal-command and command timeouts of `options.redis_timeout`;
/// connections that stay silent past the longest blocking read plus
/// `redis_timeout` are closed and reopened; TCP keep-alive.
///
/// # Errors
/// [`Error::InvalidOptions`] for a URL that does not parse, or a TLS URL
/// (`rediss://`, `rediss-sentinel://`, `valkeys://`…) in a build without
/// the `tls` feature.
pub fn client_builder(url: &str, options: &NodeOptions) -> Result<Builder> {
    let config = Config::from_url(url).map_err(|e| bad_url(url, e))?;
    let scheme = url
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    if (scheme.starts_with("rediss") || scheme.starts_with("valkeys")) && !config.uses_tls() {
        return Err(Error::InvalidOptions {
            option: "url",
            reason: format!(
                "{} asks for TLS, but flotilla-pool was built without its `{TLS_FEATURE}` feature \
                 (fred would connect in plain text): enable it, e.g. \
                 `flotilla-pool = {{ version = \"…\", features = [\"{TLS_FEATURE}\"] }}`",
                redact(url)
            ),
        });
    }
    Ok(resilient_builder(
        config,
        options.redis_timeout,
        reconnect_policy(options),
    ))
}

/// The reconnect policy of [`Node::connect`](crate::Node::connect)'s client, for a client built by
/// hand and passed to [`Node::join`](crate::Node::join): reconnect forever, pauses from 10 ms
/// doubling up to the smaller of 1 s and a tenth of
/// [`worker_ttl`](NodeOptions::worker_ttl) (at least 10 ms), with up to a third of that
/// longest pause (at most 100 ms) of random jitter within it.
///
/// Why the TTL bounds it: after an outage every worker's last renewal is
/// older than the TTL on server time. The first node back opens a recovery
/// window of one TTL; once it is over, the workers of any node not back yet
/// are cleaned up as dead and their jobs move. A node whose backoff had
/// grown past the TTL would come back too late even when Redis was down
/// for an instant longer than its pause: its jobs would move needlessly,
/// and the ends of runs it alone keeps (a finish or stop a rollback just
/// lost) could not be made to stand again.
///
/// Why a tenth: after Redis lost its data, a worker is the only holder of
/// its jobs until it has re-asserted them, and the pool counts on that
/// within a renewal period (a third of the TTL) of Redis answering again.
/// Pauses of a quarter of the TTL spent most of that period reconnecting;
/// a tenth leaves most of it to the re-assertion.
///
/// ```
/// use std::time::Duration;
/// use flotilla_pool::{reconnect_policy, NodeOptions};
/// use fred::prelude::*;
///
/// let options = NodeOptions::default().worker_ttl(Duration::from_millis(600));
/// let mut builder = Builder::from_config(Config::from_url("redis://127.0.0.1:6379").unwrap());
/// builder.set_policy(reconnect_policy(&options));
/// let client = builder.build().unwrap();
/// # drop(client);
/// ```
pub fn reconnect_policy(options: &NodeOptions) -> ReconnectPolicy {
    let longest =
        (options.worker_ttl / 10).clamp(Duration::from_millis(10), LONGEST_RECONNECT_PAUSE);
    let longest_ms = u32::try_from(longest.as_millis()).unwrap_or(u32::MAX);
    let mut policy = ReconnectPolicy::new_exponential(0, 10, longest_ms, 2);
    policy.set_jitter((longest_ms / 3).min(100));
    policy
}

/// The longest pause `policy` makes between two reconnect attempts,
/// jitter aside.
fn longest_pause_ms(policy: &ReconnectPolicy) -> u32 {
    match *policy {
        ReconnectPolicy::Constant { delay, .. } => delay,
        ReconnectPolicy::Linear { max_delay, .. }
        | ReconnectPolicy::Exponential { max_delay, .. } => max_delay,
    }
}

/// The longest pause between two reconnect attempts, whatever the TTL.
const LONGEST_RECONNECT_PAUSE: Duration = Duration::from_secs(1);

/// A fred [`Builder`] that survives restarts and failovers: reconnects
/// forever with `policy`; connection, internal-command and
/// command timeouts of `timeout`; a connection silent past the longest
/// blocking read plus `timeout` is closed and reopened; TCP keep-alive
/// finds dead peers of idle (pub/sub) connections. Shared by
/// [`client_builder`] and the multi-home worker's homes.
pub(crate) fn resilient_builder(
    config: Config,
    timeout: Duration,
    policy: ReconnectPolicy,
) -> Builder {
    let silent_after = LONGEST_BLOCK + timeout;
    let mut builder = Builder::from_config(config);
    builder
        .set_policy(policy)
        .with_connection_config(|c| {
            c.connection_timeout = timeout;
            c.internal_command_timeout = timeout;
            c.max_command_attempts = 3;
            c.unresponsive = UnresponsiveConfig {
                max_timeout: Some(silent_after),
                interval: (silent_after / 4).max(Duration::from_millis(100)),
            };
            // Without TCP_NODELAY, Nagle's algorithm may hold a small
            // command back while an earlier one on the connection is not
            // yet acknowledged, up to the peer's delayed-ACK timer (tens of
            // ms) on a real network: the pool pipelines small calls.
            c.tcp.nodelay = Some(true);
            c.tcp.keepalive = Some(
                TcpKeepalive::new()
                    .with_time(timeout.max(Duration::from_secs(1)))
                    .with_interval(Duration::from_secs(1)),
            );
        })
        .with_performance_config(|p| {
            p.default_command_timeout = timeout;
            p.broadcast_channel_capacity = 4096;
        });
    builder
}

/// Connects a built client within `timeout` and returns the client that
/// connected. A failure that may pass (no server listening yet, a reset
/// connection, a Sentinel that still names a demoted primary during a
/// failover) is tried again, with pauses of 10 ms growing to 500 ms, until
/// `timeout` has passed: a process started during a restart or failover
/// joins once Redis is back rather than exit. A wrong URL, password or TLS
/// setting fails at once.
///
/// fred asks the Sentinels in their listed order and stops at the first
/// that answers, even when the server it names turns out to be a replica;
/// a Sentinel with a stale view would then fail every attempt. So after a
/// Sentinel error the next attempt goes through a new client whose list
/// starts at the next Sentinel (same settings otherwise).
pub(crate) async fn connect_client(client: Client, timeout: Duration) -> Result<Client> {
    let address = address(&client.client_config());
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pauses = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(10))
        .with_max_delay(Duration::from_millis(500))
        .without_max_times()
        .build();
    let mut client = client;
    let mut last: Option<fred::error::Error> = None;
    let failed = loop {
        match tokio::time::timeout_at(deadline, client.init()).await {
            Ok(Ok(_)) => return Ok(client),
            Ok(Err(e)) => {
                let pause = pauses.next().unwrap_or(Duration::from_millis(500));
                if !may_pass(&e) || tokio::time::Instant::now() + pause >= deadline {
                    break unavailable(
                        e.kind().clone(),
                        format!("cannot connect to Redis at {address}: {}", reason(&e)),
                    );
                }
                tracing::debug!(%address, error = %reason(&e), ?pause, "connecting to Redis again");
                if *e.kind() == fred::error::ErrorKind::Sentinel
                    && let Some(next) = with_next_sentinel_first(&client)
                {
                    let _ = tokio::time::timeout(Duration::from_secs(1), client.quit()).await;
                    client = next;
                }
                last = Some(e);
                tokio::time::sleep(pause).await;
            }
            Err(_) => {
                break unavailable(
                    fred::error::ErrorKind::Timeout,
                    match &last {
                        Some(e) => format!(
                            "no connection to Redis at {address} within {timeout:?} (last: {})",
                            reason(e)
                        ),
                        None => format!("no connection to Redis at {address} within {timeout:?}"),
                    },
                );
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), client.quit()).await;
    Err(failed)
}

/// A new, unconnected client like `client` whose Sentinel list starts at
/// the second Sentinel (the first moves to the end); `None` unless it
/// connects through two or more Sentinels.
fn with_next_sentinel_first(client: &Client) -> Option<Client> {
    let mut config = client.client_config();
    match &mut config.server {
        ServerConfig::Sentinel { hosts, .. } if hosts.len() > 1 => hosts.rotate_left(1),
        _ => return None,
    }
    Some(Client::new(
        config,
        Some(client.perf_config()),
        Some(client.connection_config().clone()),
        client.client_reconnect_policy(),
    ))
}

/// Whether a failed first connection may succeed when tried again.
fn may_pass(e: &fred::error::Error) -> bool {
    use fred::error::ErrorKind;
    matches!(
        e.kind(),
        ErrorKind::IO
            | ErrorKind::Sentinel
            | ErrorKind::Timeout
            | ErrorKind::Canceled
            | ErrorKind::Cluster
            | ErrorKind::Routing
            | ErrorKind::Backpressure
    )
}

/// What [`Node::join`] checks on the client it is handed: a WARN when the
/// client has no reconnect policy (it would never recover from a Redis
/// restart), and a connection within `redis_timeout` (a client that was
/// never initialised would otherwise queue the node's commands forever).
pub(crate) async fn check_client(client: &Client, options: &NodeOptions) -> Result<()> {
    match client.client_reconnect_policy() {
        None => tracing::warn!(
            "the Redis client has no reconnect policy: after a Redis restart or failover it stays \
             disconnected and every pool call fails; set one (Builder::set_policy with \
             flotilla_pool::reconnect_policy(&options)) or use Node::connect"
        ),
        Some(policy) => {
            let longest = Duration::from_millis(u64::from(longest_pause_ms(&policy)));
            if longest > options.worker_ttl / 10 && longest > Duration::from_millis(10) {
                tracing::warn!(
                    longest_pause_ms = longest.as_millis() as u64,
                    worker_ttl_ms = options.worker_ttl.as_millis() as u64,
                    "the Redis client's reconnect pauses grow past a tenth of the worker TTL: \
                     after an outage this node may come back too late to re-assert its jobs in \
                     time, or after the recovery window, and its workers' jobs move as if they \
                     had died; set \
                     flotilla_pool::reconnect_policy(&options) (Builder::set_policy) or use \
                     Node::connect"
                );
            }
        }
    }
    if client.is_connected() {
        return Ok(());
    }
    let timeout = options.redis_timeout;
    match tokio::time::timeout(timeout, client.wait_for_connect()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(unavailable(
            e.kind().clone(),
            format!(
                "cannot connect to Redis at {}: {}",
                address(&client.client_config()),
                reason(&e)
            ),
        )),
        Err(_) => Err(unavailable(
            fred::error::ErrorKind::Timeout,
            format!(
                "the Redis client for {} is not connected and did not connect within {timeout:?}: \
                 call `client.init().await` before Node::join (or use Node::connect), and check \
                 that Redis is reachable",
                address(&client.client_config())
            ),
        )),
    }
}

/// What an eviction policy means for the pool's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Eviction {
    /// No eviction (`noeviction`, or no `maxmemory`): Redis refuses writes
    /// when full, which the pool reports and retries.
    Safe,
    /// Only keys with a time to live go (`volatile-*`): the pool's locks
    /// (the sweeper's lease, [`Lock`](crate::Lock)) and admission markers
    /// could vanish before they expire.
    KeysWithTtl,
    /// Any key may go (`allkeys-*`): job records, payloads, fencing
    /// counters, inboxes — jobs lost or run twice without a trace.
    AnyKey,
}

/// How `maxmemory` and `maxmemory-policy`, as `INFO memory` gives them,
/// treat the pool's keys.
pub(crate) fn eviction(info: &str) -> (Eviction, String) {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    };
    let maxmemory: u64 = field("maxmemory").and_then(|v| v.parse().ok()).unwrap_or(0);
    let policy = field("maxmemory_policy").unwrap_or_default();
    let kind = if maxmemory == 0 || policy.is_empty() || policy == "noeviction" {
        Eviction::Safe
    } else if policy.starts_with("allkeys") {
        Eviction::AnyKey
    } else {
        Eviction::KeysWithTtl
    };
    (kind, policy)
}

/// Refuses a server that may evict any of the pool's keys
/// ([`Error::UnsafeServer`]) and warns of one that may evict keys with a
/// time to live. A server that does not answer `INFO memory` (an ACL
/// without `+info`) is not checked.
pub(crate) async fn check_eviction(client: &Client, options: &NodeOptions) -> Result<()> {
    let info = tokio::time::timeout(
        options.redis_timeout,
        client.info::<String>(Some(fred::types::InfoKind::Memory)),
    )
    .await;
    let info = match info {
        Ok(Ok(info)) => info,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "INFO memory failed: the eviction policy is not checked");
            return Ok(());
        }
        Err(_) => {
            tracing::debug!("INFO memory timed out: the eviction policy is not checked");
            return Ok(());
        }
    };
    match eviction(&info) {
        (Eviction::Safe, _) => Ok(()),
        (Eviction::KeysWithTtl, policy) => {
            tracing::warn!(
                policy,
                "Redis may evict keys with a time to live when full (maxmemory-policy): the                  pool's locks and admission markers could vanish early; set maxmemory-policy                  noeviction"
            );
            Ok(())
        }
        (Eviction::AnyKey, policy) => Err(Error::UnsafeServer {
            setting: "maxmemory-policy",
            value: policy,
            reason: "with maxmemory set, Redis evicts any key when full, the pool's job                      records, payloads and fencing counters among them (jobs lost or run                      twice); set `maxmemory-policy noeviction` (or no maxmemory) on this server"
                .to_string(),
        }),
    }
}

/// Where a client connects, for error messages (never a password).
pub(crate) fn address(config: &Config) -> String {
    let list = |hosts: &[fred::types::config::Server]| {
        hosts
            .iter()
            .map(|s| format!("{}:{}", s.host, s.port))
            .collect::<Vec<_>>()
            .join(",")
    };
    match &config.server {
        ServerConfig::Centralized { server } => format!("{}:{}", server.host, server.port),
        ServerConfig::Clustered { hosts, .. } => format!("cluster {}", list(hosts)),
        ServerConfig::Sentinel {
            hosts,
            service_name,
            ..
        } => format!("{service_name} via sentinels {}", list(hosts)),
        #[allow(unreachable_patterns)]
        other => format!("{other:?}"),
    }
}

/// The short reason of a connection error: the OS message of an I/O error
/// (fred's text for one is a debug dump), else fred's details.
pub(crate) fn reason(e: &fred::error::Error) -> String {
    let details = e.details();
    if let Some(start) = details.find("message: \"") {
        let rest = &details[start + 10..];
        if let Some(end) = rest.find('"') {
            return rest[..end].to_string();
        }
    }
    details.to_string()
}

fn unavailable(kind: fred::error::ErrorKind, text: String) -> Error {
    Error::Unavailable(fred::error::Error::new(kind, text))
}

pub(crate) fn bad_url(url: &str, e: fred::error::Error) -> Error {
    Error::InvalidOptions {
        option: "url",
        reason: format!("{}: {}", redact(url), e.details()),
    }
}

/// `url` with any password replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let tail = match tail.find("sentinelPassword=") {
        Some(i) => {
            let end = tail[i..].find('&').map_or(tail.len(), |e| i + e);
            format!("{}sentinelPassword=***{}", &tail[..i], &tail[end..])
        }
        None => tail.to_string(),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        None => format!("{scheme}://{authority}{tail}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_policies_are_judged_from_info_memory() {
        let info = |max: &str, policy: &str| {
            format!(
                "# Memory\r\nused_memory:1000\r\nmaxmemory:{max}\r\nmaxmemory_human:x\r\nmaxmemory_policy:{policy}\r\n"
            )
        };
        assert_eq!(eviction(&info("0", "allkeys-lru")).0, Eviction::Safe);
        assert_eq!(eviction(&info("1048576", "noeviction")).0, Eviction::Safe);
        assert_eq!(
            eviction(&info("1048576", "allkeys-lfu")),
            (Eviction::AnyKey, "allkeys-lfu".to_string())
        );
        assert_eq!(
            eviction(&info("1048576", "volatile-ttl")).0,
            Eviction::KeysWithTtl
        );
        assert_eq!(eviction("").0, Eviction::Safe, "nothing to judge");
    }

    #[test]
    fn urls_are_shown_without_passwords() {
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact("redis://u:s3cret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(
            redact("redis-sentinel://:pw@h:1?sentinelServiceName=m&sentinelPassword=x&node=a:2"),
            "redis-sentinel://:***@h:1?sentinelServiceName=m&sentinelPassword=***&node=a:2"
        );
    }

    #[test]
    fn sentinel_urls_name_every_sentinel_and_the_service() {
        let config =
            Config::from_url("redis-sentinel://h:1?sentinelServiceName=m&node=a:2&node=b:3")
                .unwrap();
        assert_eq!(address(&config), "m via sentinels a:2,b:3,h:1");
        assert!(config.server.is_sentinel());
    }

    #[test]
    fn tls_urls_need_the_tls_feature() {
        let tls_built_in = Config::from_url("rediss://h:1").unwrap().uses_tls();
        for url in [
            "rediss://u:pw@h:1",
            "rediss-sentinel://h:1?sentinelServiceName=m",
        ] {
            match client_builder(url, &NodeOptions::default()) {
                Ok(_) => assert!(tls_built_in, "{url}"),
                Err(e) => {
                    assert!(!tls_built_in, "{url}: {e}");
                    let text = e.to_string();
                    assert!(
                        text.contains("`tls` feature") && !text.contains("pw"),
                        "{text}"
                    );
                }
            }
        }
    }

    #[test]
    fn commands_are_sent_without_nagle_delays() {
        let builder = client_builder("redis://127.0.0.1:6379", &NodeOptions::default()).unwrap();
        assert_eq!(builder.get_connection_config().tcp.nodelay, Some(true));
    }

    #[test]
    fn bad_urls_are_refused() {
        let e = client_builder("redis-sentinel://h:1", &NodeOptions::default()).unwrap_err();
        assert!(
            matches!(e, Error::InvalidOptions { option: "url", .. }),
            "{e}"
        );
    }
}
