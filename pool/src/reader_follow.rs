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
        match (commands.as_ref(), read_from) {
            (Some(commands), Some(read_from)) if commands == read_from => return true,
            (Some(commands), Some(read_from)) => {
                // Logged once per reader move, not per entry: a woken
                // primary may hand over hundreds meanwhile.
                if self.move_reader_soon() {
                    tracing::info!(
                        node = %self.id,
                        commands = %address(commands),
                        read_from = %address(read_from),
                        "an inbox entry read from another server than the commands go to is \
                         claimed before it starts; the reader reconnects"
                    );
                }
            }
            // Either server unknown (a connection between two attempts):
            // claimed first, nothing moved.
            _ => {
                tracing::debug!(node = %self.id, "an inbox entry read while a server is not known is claimed before it starts")
            }
        }
        false
    }

    /// Makes the reader reconnect, in the background, to the server the
    /// Sentinels name: at most once per TTL, shared with the reconnects
    /// after a superseded server (which move the reader too), since a stop
    /// asks again, and entries arrive, every few milliseconds meanwhile.
    /// Returns whether it moves the reader now.
    pub(crate) fn move_reader_soon(&self) -> bool {
        let due = self
            .primary_check
            .as_ref()
            .is_some_and(|c| once_per(&c.last_reconnect, self.options.worker_ttl));
        if !due {
            return false;
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
        true
    }
}
