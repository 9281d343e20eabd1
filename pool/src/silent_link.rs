//! A command connection that stopped answering while the server and any
//! new connection work: a socket half-open one way, which no error
//! reports (the kernel sees nothing wrong until TCP gives up, minutes
//! later). Every command on it waits out its timeout, and fred closes a
//! silent connection only past the longest blocking read (see
//! `client.rs`), seconds after the lease is lost. So a keep-alive that
//! gets no reply within its renewal period has the node try a new
//! connection; if that one answers within the period, the client
//! reconnects and the next renewal goes over a new socket. On a link
//! merely slow (or a server stalled), a new connection is no faster and
//! the client keeps its connection: a reconnect would cost the commands
//! in flight and answer nothing sooner.
//!
//! ```text
//! renewal ──times out──▶ probe: new connection + PING ──answers──▶ force_reconnection
//!                                                     └─silent───▶ keep the connection
//! ```

use std::time::Duration;

use fred::prelude::ClientLike;

use crate::node::NodeInner;

impl NodeInner {
    /// Reconnects the client if a new connection answers within `within`
    /// while its own did not (see the module docs); waits at most about
    /// twice `within`. Commands in flight on the old connection are sent
    /// again on the new one, as after any broken connection.
    pub(crate) async fn reconnect_silent_link(&self, within: Duration) {
        if !self.new_connection_answers(within).await {
            tracing::debug!(
                node = %self.id,
                "a new connection does not answer sooner: the link or the server is slow"
            );
            return;
        }
        tracing::warn!(
            node = %self.id,
            "a keep-alive got no reply within its renewal period, and a new connection \
             answers at once: reconnecting"
        );
        match tokio::time::timeout(within, self.store.client.force_reconnection()).await {
            Ok(Ok(())) => tracing::info!(node = %self.id, "reconnected after a silent keep-alive"),
            Ok(Err(e)) => tracing::warn!(node = %self.id, error = %e, "reconnecting failed"),
            Err(_) => tracing::warn!(node = %self.id, "reconnecting timed out"),
        }
    }

    /// Whether a new connection with the client's settings (no reconnect
    /// policy: one attempt) connects and answers a `PING` within `within`.
    /// The probe's connection is closed either way.
    async fn new_connection_answers(&self, within: Duration) -> bool {
        let client = &self.store.client;
        let probe = fred::prelude::Client::new(
            client.client_config(),
            Some(client.perf_config()),
            Some(client.connection_config().clone()),
            None,
        );
        let task = probe.connect();
        let answered = tokio::time::timeout(within, async {
            probe.wait_for_connect().await?;
            probe.ping::<String>(None).await
        })
        .await;
        let answered = match answered {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => {
                tracing::debug!(node = %self.id, error = %e, "a new connection failed");
                false
            }
            Err(_) => false,
        };
        // Not used again: ending its task closes its socket.
        task.abort();
        answered
    }
}
