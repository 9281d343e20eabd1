//! Dedicated connections for blocking reads, and retry backoff.

use std::time::Duration;

use fred::prelude::*;
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand};

use crate::Error;

/// A new connection with the given client's config, for blocking reads only
/// (on the shared multiplexed client they would stall every other
/// command). It reconnects by itself: the given client's reconnect policy,
/// or exponential 10 ms … 1 s forever when it has none.
pub(crate) async fn dedicated(client: &Client) -> Result<Client, Error> {
    let policy = client
        .client_reconnect_policy()
        .unwrap_or_else(|| ReconnectPolicy::new_exponential(0, 10, 1_000, 2));
    let conn = Client::new(
        client.client_config(),
        Some(client.perf_config()),
        Some(client.connection_config().clone()),
        Some(policy),
    );
    conn.init().await?;
    Ok(conn)
}

/// Per-command options of a blocking read: a timeout that outlasts the block.
pub(crate) fn blocking_options(block: Duration) -> Options {
    Options {
        timeout: Some(block + Duration::from_secs(5)),
        ..Options::default()
    }
}

/// Interrupts a blocking read on `conn`: `CLIENT UNBLOCK <id> TIMEOUT` sent
/// on `client`, the shared multiplexed client (on Redis Cluster to the node
/// `conn` is blocked on). Not fred's `client_unblock`: that one keeps a
/// backchannel connection open per blocking connection, one more
/// connection per reader for good. Errors are ignored (the read ends by
/// itself).
pub(crate) async fn unblock(client: &Client, conn: &Client) {
    let clustered = client.is_clustered();
    for (server, id) in conn.connection_ids() {
        let options = Options {
            cluster_node: clustered.then_some(server),
            timeout: Some(Duration::from_secs(1)),
            ..Options::default()
        };
        let command = CustomCommand::new_static("CLIENT", ClusterHash::Random, false);
        let r: Result<Value, _> = client
            .with_options(&options)
            .custom(
                command,
                vec![Value::from("UNBLOCK"), id.into(), "TIMEOUT".into()],
            )
            .await;
        if let Err(e) = r {
            tracing::debug!(error = %e, "CLIENT UNBLOCK failed");
        }
    }
}

/// Exponential backoff for retry loops: 50 ms doubling to 2 s.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff {
            next: Duration::from_millis(50),
        }
    }

    pub(crate) fn reset(&mut self) {
        self.next = Duration::from_millis(50);
    }

    /// The delay to wait now; doubles the next one.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(Duration::from_secs(2));
        d
    }
}

/// Closes a dedicated connection, interrupting a blocked read first (on
/// `client`, see [`unblock`]); gives up after 1 s (the connection is
/// dropped anyway).
pub(crate) async fn quit(client: &Client, conn: &Client) -> Result<(), Error> {
    unblock(client, conn).await;
    match tokio::time::timeout(Duration::from_secs(1), conn.quit()).await {
        Ok(r) => r.map_err(Error::from),
        Err(_) => Ok(()),
    }
}
