//! The reader's server against the commands' server, behind Sentinel: a
//! node's reader keeps a connection of its own, which can stay on a
//! primary that stalled through its failover while the node's commands
//! moved to the promoted one (see [`crate::primary_check`]).

use fred::prelude::{ClientLike, Server};

use crate::node::NodeInner;
use crate::primary_check::{address, once_per};

impl NodeInner {
    /// Whether an inbox entry the reader read from `read_from` (see
    /// `flotilla_streaming::Event::server`) comes from the server this
    /// node's commands go to: always without Sentinel. Behind Sentinel the
    /// reader's connection can stay on a primary that stalled through its
    /// failover while the commands moved to the promoted one; once the
    /// stalled one wakes, it runs the scripts its clients sent into the
    /// stall (a cleanup's move, a requeue) and its entries reach the
    /// reader with stream ids after the node's last doubt, so they would
    /// pass for fresh and start before any claim (chaos soak seed 1625:
    /// `job-0965` started from such an entry beside its run on the
    /// promoted side). Such an entry is claimed first, on the server the
    /// commands go to, and the reader is made to follow the commands.
    pub(crate) fn read_where_commands_go(&self, read_from: Option<&Server>) -> bool {
        if self.primary_check.is_none() {
            return true;
        }
        let commands = self.store.client.active_connections().into_iter().next();
        if commands.is_some() && commands.as_ref() == read_from {
            return true;
        }
        tracing::info!(
            node = %self.id,
            commands = ?commands.as_ref().map(address),
            read_from = ?read_from.map(address),
            "an inbox entry read from another server than the commands go to is claimed \
             before it starts; the reader reconnects"
        );
        self.move_reader_soon();
        false
    }

    /// Makes the reader reconnect, in the background, to the server the
    /// Sentinels name: at most once per TTL, shared with the reconnects
    /// after a superseded server (which move the reader too), since a stop
    /// asks again, and entries arrive, every few milliseconds meanwhile.
    pub(crate) fn move_reader_soon(&self) {
        let due = self
            .primary_check
            .as_ref()
            .is_some_and(|c| once_per(&c.last_reconnect, self.options.worker_ttl));
        if !due {
            return;
        }
        let reader = self.reader.clone();
        let timeout = self.options.redis_timeout;
        self.tasks.spawn(async move {
            match tokio::time::timeout(timeout, reader.reconnect()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "the reader's reconnection failed"),
                Err(_) => tracing::warn!("the reader did not reconnect in time"),
            }
        });
    }
}
