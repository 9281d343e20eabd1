//! A command connection that stopped answering while the server and any
//! new connection work: a socket half-open one way, which no error
//! reports (the kernel sees nothing wrong until TCP gives up, minutes
//! later). Every command on it waits out its timeout, and fred closes a
//! silent connection only past the longest blocking read (see
//! `client.rs`), seconds after the lease is lost. So a keep-alive that
//! gets no reply within its renewal period has the node send a `PING` on
//! its connection and, at once, on a new one: if only the new one answers
//! within the period, the client reconnects and the next renewal goes over
//! a new socket. On a link merely slow, a new connection is no faster; a
//! stalled server that answers again answers both: the client keeps its
//! connection either way (a reconnect would cost the commands in flight
//! and answer nothing sooner).
//!
//! ```text
//! renewal ──times out──▶ PING on the connection ─┐
//!                        PING on a new one ──────┴─▶ only the new one answers ──▶ force_reconnection
//!                                                    otherwise ─────────────────▶ keep the connection
//! ```

use std::time::Duration;

use fred::prelude::ClientLike;

use crate::node::NodeInner;

impl NodeInner {
    /// Reconnects the client if, within `within`, a new connection answers
    /// a `PING` and the client's own connection does not answer one sent
    /// at the same time (see the module docs); waits at most about twice
    /// `within`. A server that was stalled and answers again answers both:
    /// its connections are kept. Commands in flight on the old connection
    /// are sent again on the new one, as after any broken connection.
    pub(crate) async fn reconnect_silent_link(&self, within: Duration) {
        let own = tokio::time::timeout(within, self.store.client.ping::<String>(None));
        let (own, probe) = tokio::join!(own, self.new_connection_answers(within));
        if matches!(own, Ok(Ok(_))) || !probe {
            tracing::debug!(
                node = %self.id,
                own_answered = matches!(own, Ok(Ok(_))),
                probe_answered = probe,
                "a keep-alive timed out, but its connection is not silent alone: kept"
            );
            return;
        }
        tracing::warn!(
            node = %self.id,
            "a keep-alive got no reply within its renewal period, nor a PING after it, \
             while a new connection answers: reconnecting"
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
        // Ends, closing its socket, however this call ends (a timeout, the
        // node closing).
        let _task = tokio_util::task::AbortOnDropHandle::new(probe.connect());
        let answered = tokio::time::timeout(within, async {
            probe.wait_for_connect().await?;
            probe.ping::<String>(None).await
        })
        .await;
        match answered {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => {
                tracing::debug!(node = %self.id, error = %e, "a new connection failed");
                false
            }
            Err(_) => false,
        }
    }
}
