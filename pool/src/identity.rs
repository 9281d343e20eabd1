//! The identity of the server holding the pool's keys: its run id and the
//! generation of the pool's data. A new run id (Redis restarted, or another
//! server took over) or a new generation (the data lost on a server that
//! kept running) means Redis may have lost writes: the node opens the
//! recovery window and has the rollback task (`crate::rollback`) recover.
//! Checked after every reconnect, when a renewal finds a worker Redis
//! forgot, and periodically.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::node::NodeInner;
use crate::rollback::RETRY;

/// How often, at most, a node reads the server's identity besides after
/// reconnects; a third of the TTL when that is shorter (see
/// [`identity_every`]).
const IDENTITY_EVERY: Duration = Duration::from_secs(2);

impl NodeInner {
    /// Checks the server's identity after each reconnect (several
    /// reconnects during one check lead to one more check), when a renewal
    /// found a worker Redis forgot, and every [`identity_every`] besides: a
    /// node that learns of a new server here recovers even when none of its
    /// scripts ran meanwhile.
    pub(crate) async fn server_identity_loop(self: Arc<Self>) {
        let mut reconnects = self.reconnects.subscribe();
        let mut every = tokio::time::interval(identity_every(self.options.worker_ttl));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await; // the first tick is now: joining checked it
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                changed = reconnects.changed() => if changed.is_err() { return },
                _ = self.identity_wanted.notified() => {}
                _ = every.tick() => {}
            }
            reconnects.borrow_and_update();
            self.check_server_identity().await;
        }
    }

    /// Reads the identity of the server holding the pool's keys until
    /// Redis answers, and acts on it (see [`Self::check_identity_once`]).
    async fn check_server_identity(&self) {
        loop {
            match self.check_identity_once().await {
                Ok(()) => return,
                Err(e) if refused_by_acl(&e) => {
                    // Retried by the caller's loop (every IDENTITY_EVERY),
                    // not at once: the answer will not change soon.
                    if !self
                        .identity_refused
                        .swap(true, std::sync::atomic::Ordering::Relaxed)
                    {
                        tracing::warn!(node = %self.id, error = %e, "Redis refuses INFO to this user (grant +info, see the pool README, ACL): a restart or failover whose lost writes held no keep-alive renewal may go unseen by this node's scripts");
                    }
                    return;
                }
                Err(e) => {
                    tracing::debug!(node = %self.id, error = %e, "reading the server's run id failed; retrying");
                    tokio::select! {
                        _ = self.cancel.cancelled() => return,
                        _ = tokio::time::sleep(RETRY) => {}
                    }
                }
            }
        }
    }

    /// Reads the identity of the server holding the pool's keys once and,
    /// when its run id changed (the server restarted or another took over)
    /// or the pool's data is of a new generation (lost on a server that
    /// kept running), opens the recovery window and has the rollback task
    /// recover. A replica's revisions alone can miss a rollback: the writes
    /// made after it may bring a revision back above what a node saw before
    /// the node resyncs. Checks are one at a time (the lock is held
    /// throughout): one that returns has opened the window for any change
    /// it or one before it found.
    pub(crate) async fn check_identity_once(&self) -> Result<()> {
        let lock_asked = std::time::Instant::now();
        let mut seen = self.server_seen.lock().await;
        let lock_wait = lock_asked.elapsed();
        let read_asked = std::time::Instant::now();
        // Named the server checked last, the read opens the window itself
        // when the server is another (see `server_id.lua`).
        let crate::store::IdentityRead {
            server,
            window_opened,
        } = self
            .store
            .server_identity_since(self.options.worker_ttl, seen.as_ref())
            .await?;
        let read = read_asked.elapsed();
        let previous = seen.replace(server.clone());
        let restarted = previous
            .as_ref()
            .is_some_and(|previous| previous.run_id != server.run_id);
        // The same server with a new generation of the pool's data: it was
        // lost while the server kept running (a `FLUSHALL`, deleted keys),
        // which no run id shows. A node that mirrors no map would see that
        // only at its next admission, after the orphan sweep may have
        // requeued a job whose stop this node answered for (soak seed 491:
        // a stopped job given back by the worker that had handed it off).
        let lost = !restarted
            && previous
                .as_ref()
                .is_some_and(|previous| previous.generation != server.generation);
        // How long the check waited for an earlier one and for Redis: a
        // node's recovery waits for both.
        if restarted {
            tracing::warn!(node = %self.id, run_id = %server.run_id, ?lock_wait, ?read, "Redis restarted or failed over (new run id): it may have lost writes");
        }
        if lost {
            tracing::warn!(node = %self.id, ?lock_wait, ?read, "Redis lost the pool's data without a restart (a new generation of it on the same server)");
        }
        if restarted || lost {
            // Open the window before this node's scripts stop comparing
            // Redis with the old server, and before its workers re-assert
            // what they hold: the window another node opened may be over
            // already (this node was cut off, or Redis refused writes),
            // and a stop made since by a node that has not made it stand
            // again yet would be undone (soak seed 1404). The rollback
            // task opens it too.
            // Not taken as seen when that fails (Redis refuses writes): the
            // next check finds the change again, and the caller, a renewal,
            // asks the identity task to retry.
            // The read opened it already, unless the server named was not
            // the one compared with here (not expected: the same record).
            let asked = std::time::Instant::now();
            if !window_opened
                && let Err(e) = self.store.begin_recovery(self.options.worker_ttl).await
            {
                tracing::warn!(node = %self.id, error = %e, "opening the recovery window failed; checking again");
                *seen = previous;
                return Err(e);
            }
            tracing::info!(node = %self.id, with_the_read = window_opened, took = ?asked.elapsed(), "recovery window opened");
            // Opened by the read: some time after it was sent, which is
            // what its age is counted from (never younger than it is).
            let opened_at = if window_opened { read_asked } else { asked };
            *self
                .window_opened_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(opened_at);
        }
        // From now on the scripts compare Redis with this server: the
        // restart is this node's to recover from.
        self.store.note_server(server);
        if restarted || lost {
            self.server_restarts.send_modify(|n| *n += 1);
        }
        Ok(())
    }
}

/// Time between two identity checks of a node whose TTL is `ttl`: the
/// first node to notice a loss opens the recovery window for one TTL, and
/// every other node must notice within it to make its stops stand again
/// before the orphan sweep may requeue a job one of them stopped.
fn identity_every(ttl: Duration) -> Duration {
    IDENTITY_EVERY.min(ttl / 3)
}

/// Whether Redis refused a call for lack of permissions (an ACL without a
/// command the call needs).
fn refused_by_acl(e: &crate::error::Error) -> bool {
    let text = e.to_string();
    text.contains("NOPERM") || text.contains("can't run this command")
}
