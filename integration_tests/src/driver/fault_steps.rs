//! The steps the fault schedule (`faults.rs`) is made of: putting the
//! busiest process's link in a mode or pausing it, removing a process,
//! running something on the Redis server, and watching for recovery.

use std::collections::BTreeMap;
use std::time::Duration;

use flotilla_testkit::{ProxyMode, RedisServer, Sentinels};
use nix::sys::signal::Signal;
use rand::Rng;
use rand::seq::SliceRandom;
use tokio::time::Instant;

use super::fleet::Health;
use super::{ChaosError, Run};
use crate::clock::mono_ns;
use crate::ledger::FaultKind;

/// `not_running` split into the keys not running at any poll of the last
/// `span` before `now` (by `missing_since`, each key's first poll since
/// which it has not run) and the others.
fn missing_for(
    not_running: Vec<String>,
    missing_since: &BTreeMap<String, Instant>,
    now: Instant,
    span: Duration,
) -> (Vec<String>, Vec<String>) {
    not_running.into_iter().partition(|key| {
        missing_since
            .get(key)
            .is_some_and(|since| now.saturating_duration_since(*since) >= span)
    })
}

impl Run {
    /// Notes a recovery that did not end in time, with the keys still
    /// missing (the final check may find them lost to two faults at once).
    pub(super) fn not_recovered(&mut self, message: String, missing: Vec<String>) {
        self.unrecovered.push(super::Unrecovered {
            message,
            missing,
            at_ns: mono_ns(),
        });
    }

    /// [`not_recovered`](Self::not_recovered) with the keys not running
    /// now, named after `what`: those not running at any poll of the last
    /// TTL. A key that ran within it is between the stop and the start of
    /// a move (a hand-off, a rebalance) and had recovered: with keys lost
    /// to two faults the pool never counts as recovered, and the limit's
    /// last poll otherwise judged such a key (seed 1611: `job-4036`, its
    /// hand-off's start 37 ms after the limit).
    pub(super) fn keys_not_recovered(&mut self, what: String) {
        let not_running = self.not_running();
        let (missing, moving) = missing_for(
            not_running,
            &self.still_missing,
            Instant::now(),
            self.options.ttl,
        );
        let shown: Vec<&str> = missing.iter().take(5).map(String::as_str).collect();
        let message = format!(
            "{what}: {} keys not running on a member that is up, e.g. {} \
             ({} more not running for under a TTL, ran within it)",
            missing.len(),
            shown.join(", "),
            moving.len()
        );
        if missing.is_empty() {
            tracing::info!("{message}: recovered");
            return;
        }
        self.not_recovered(message, missing);
    }

    /// The Redis server's address (the processes' proxies forward to it).
    pub(super) fn server_addr(&self) -> Result<std::net::SocketAddr, ChaosError> {
        Ok(self
            .server
            .lock()
            .map(|s| s.addr())
            .map_err(|_| flotilla_testkit::Error::Startup("server lock poisoned".into()))?)
    }

    /// Runs `f` on the Redis server, on a blocking thread (it waits for
    /// the server's processes and files).
    pub(super) async fn on_server<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut RedisServer) -> Result<T, flotilla_testkit::Error> + Send + 'static,
    ) -> Result<T, ChaosError> {
        let server = self.server.clone();
        let result = tokio::task::spawn_blocking(move || {
            let mut server = server
                .lock()
                .map_err(|_| flotilla_testkit::Error::Startup("server lock poisoned".into()))?;
            f(&mut server)
        })
        .await
        .map_err(|e| flotilla_testkit::Error::Startup(e.to_string()))?;
        Ok(result?)
    }

    /// Puts the link of the process that holds the most jobs in `mode` and
    /// records the fault's start; `None` when no process is up.
    pub(super) fn degrade_busiest_link(&mut self, kind: FaultKind, mode: ProxyMode) -> Option<u32> {
        self.fleet.refresh();
        let pid = self.fleet.busiest_up()?;
        self.degrade_link(kind, pid, mode);
        Some(pid)
    }

    /// Puts the link of `pid` in `mode` and records the fault's start.
    pub(super) fn degrade_link(&mut self, kind: FaultKind, pid: u32, mode: ProxyMode) {
        if let Some(m) = self.fleet.member(pid) {
            m.proxy.set_mode(mode);
            m.health = Health::Cut;
        }
        self.record(kind, Some(pid), false);
    }

    /// Puts the busiest process's link in `mode` for `hold` from `since`,
    /// watching for recovery meanwhile, then heals it; its pid, or `None`
    /// when no process is up.
    pub(super) async fn hold_busiest_link(
        &mut self,
        kind: FaultKind,
        mode: ProxyMode,
        since: Instant,
        hold: Duration,
        recovered: &mut Option<Duration>,
    ) -> Option<u32> {
        let pid = self.degrade_busiest_link(kind, mode)?;
        self.observe(since, since + hold, false, recovered).await;
        if let ProxyMode::Delay(delay) = mode {
            // A slow link's bytes already on their way still take the
            // delay after it heals, and what follows waits behind them:
            // the fault ends once they are through (seed 1471: the key
            // admitted again 202 ms after the recorded end, while the
            // holder's link still delivered late, was flagged I3).
            if let Some(m) = self.fleet.member(pid) {
                m.proxy.heal();
            }
            tokio::time::sleep(delay).await;
        }
        self.heal_link(kind, pid);
        Some(pid)
    }

    /// `SIGSTOP`s the busiest process that is up and records the fault's
    /// start; its pid, or `None` when no process is up.
    pub(super) fn pause_busiest(&mut self, kind: FaultKind) -> Result<Option<u32>, ChaosError> {
        self.fleet.refresh();
        let Some(pid) = self.fleet.busiest_up() else {
            return Ok(None);
        };
        if let Some(m) = self.fleet.member(pid) {
            m.process.signal(Signal::SIGSTOP)?;
            m.health = Health::Paused;
        }
        self.record(kind, Some(pid), false);
        Ok(Some(pid))
    }

    /// The first part of [`FaultKind::StopLeave`]: a short-lived
    /// client-only node stops up to five jobs of the newest process and
    /// closes, then that process is removed. Its pid, or `None` when no
    /// process is up.
    pub(super) async fn stop_and_leave(&mut self) -> Result<Option<u32>, ChaosError> {
        self.fleet.refresh();
        let Some(pid) = self.fleet.newest_up() else {
            return Ok(None);
        };
        self.record(FaultKind::StopLeave, Some(pid), false);
        let mut keys = self.fleet.keys_on(pid);
        keys.shuffle(&mut self.rng);
        keys.truncate(5);
        let (url, pool, options) = &self.transient;
        // Redis may be down (overlapping faults): the process still goes.
        let joined = match super::node_client(url, options).await {
            Ok(client) => flotilla_pool::Node::join(&client, pool, options.clone())
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match joined {
            Ok(node) => {
                self.load.stop_through(&node, &keys).await;
                if let Err(e) = node.close().await {
                    tracing::warn!(error = %e, "closing the short-lived client failed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "the short-lived client could not join"),
        }
        self.record(FaultKind::StopLeave, Some(pid), true);
        self.record(FaultKind::RemoveWorker, Some(pid), false);
        self.await_removal(pid).await?;
        Ok(Some(pid))
    }

    /// Sends `SIGTERM` to `pid` (again, if it had one) and waits up to 15 s
    /// for it to close its node and exit (killing it after that, noted as
    /// not recovered); records the end of its removal and forgets it.
    pub(super) async fn await_removal(&mut self, pid: u32) -> Result<(), ChaosError> {
        let mut clean = true;
        if let Some(m) = self.fleet.member(pid) {
            clean = m.process.terminate(Duration::from_secs(15)).await?;
        }
        self.record(FaultKind::RemoveWorker, Some(pid), true);
        self.fleet.forget(pid);
        if !clean {
            self.not_recovered(
                format!("worker process {pid} did not exit on SIGTERM within 15 s"),
                Vec::new(),
            );
        }
        Ok(())
    }

    /// Heals the link of `pid` and records the fault's end.
    pub(super) fn heal_link(&mut self, kind: FaultKind, pid: u32) {
        if let Some(m) = self.fleet.member(pid) {
            m.proxy.heal();
            m.health = Health::Up;
        }
        self.record(kind, Some(pid), true);
    }

    /// Polls for recovery until `until` (or, with `stop_early`, until
    /// recovered), noting the first time it is.
    pub(super) async fn observe(
        &mut self,
        since: Instant,
        until: Instant,
        stop_early: bool,
        recovered: &mut Option<Duration>,
    ) {
        loop {
            if recovered.is_none() {
                let missing = self.not_running();
                if missing.is_empty() {
                    *recovered = Some(since.elapsed());
                } else {
                    let now = Instant::now();
                    let mut was = std::mem::take(&mut self.still_missing);
                    self.still_missing = missing
                        .into_iter()
                        .map(|key| {
                            let since = was.remove(&key).unwrap_or(now);
                            (key, since)
                        })
                        .collect();
                }
            }
            if (stop_early && recovered.is_some()) || Instant::now() >= until {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// [`FaultKind::ClockStep`]: the server's wall clock steps forward
    /// 1–30 s (two times in three) or back 0.2–1 TTL, at once.
    pub(super) async fn step_server_clock(&mut self) -> Result<(), ChaosError> {
        let ttl = self.options.ttl.as_millis() as i64;
        let by_ms = if self.rng.random_range(0..3) < 2 {
            self.rng.random_range(1_000..=30_000)
        } else {
            -self.rng.random_range(ttl / 5..=ttl)
        };
        self.record(FaultKind::ClockStep, None, false);
        self.on_server(move |s| s.shift_clock(by_ms)).await?;
        self.record(FaultKind::ClockStep, None, true);
        tracing::info!(by_ms, "redis clock stepped");
        Ok(())
    }

    /// Runs `f` on the Sentinel deployment, on a blocking thread (it
    /// polls the servers and Sentinels); `None` without one.
    pub(super) async fn on_sentinels<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Sentinels) -> Result<T, flotilla_testkit::Error> + Send + 'static,
    ) -> Result<Option<T>, ChaosError> {
        let Some(ha) = self.sentinels.clone() else {
            return Ok(None);
        };
        let result = tokio::task::spawn_blocking(move || {
            let mut ha = ha
                .lock()
                .map_err(|_| flotilla_testkit::Error::Startup("sentinels lock poisoned".into()))?;
            f(&mut ha)
        })
        .await
        .map_err(|e| flotilla_testkit::Error::Startup(e.to_string()))??;
        Ok(Some(result))
    }

    /// [`FaultKind::FrozenFailover`]: the primary frozen (`SIGSTOP`) until
    /// the Sentinels have promoted the replica; one time in two a worker
    /// process joins then (on the new primary); 0.5–2 TTLs after the
    /// promotion the old primary wakes, and every client still connected
    /// to it writes there until a Sentinel turns it into a replica (told
    /// by the driver after 20 s if none has). The process added, if any.
    pub(super) async fn frozen_failover(&mut self) -> Result<Option<u32>, ChaosError> {
        let kind = FaultKind::FrozenFailover;
        let Some((old, pid)) = self
            .on_sentinels(|ha| {
                let old = ha.primary_port().ok_or_else(|| {
                    flotilla_testkit::Error::Startup("the sentinels agree on no primary".into())
                })?;
                let pid = ha.server_pid(old).ok_or_else(|| {
                    flotilla_testkit::Error::Startup(format!("no running server on port {old}"))
                })?;
                Ok((old, pid))
            })
            .await?
        else {
            return Ok(None);
        };
        let signal = |signal: Signal| {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal)
                .map_err(|e| crate::process::ProcessError::Signal(signal, pid, e))
        };
        self.record(kind, None, false);
        signal(Signal::SIGSTOP)?;
        let promoted = self
            .on_sentinels(move |ha| ha.wait_for_failover(old, Duration::from_secs(30)))
            .await;
        if let Err(e) = promoted {
            let _ = signal(Signal::SIGCONT);
            return Err(e);
        }
        let mut joined = None;
        if self.rng.random_bool(0.5) {
            let addr = self.server_addr()?;
            match self.fleet.add(addr).await {
                Ok(pid) => joined = Some(pid),
                Err(e) => {
                    let _ = signal(Signal::SIGCONT);
                    return Err(e.into());
                }
            }
        }
        let ttl = self.options.ttl;
        tokio::time::sleep(self.rng.random_range(ttl / 2..=ttl * 2)).await;
        signal(Signal::SIGCONT)?;
        tracing::info!(old, "the frozen primary wakes");
        self.on_sentinels(move |ha| {
            ha.wait_for_replica(old, Duration::from_secs(60), Duration::from_secs(20))
        })
        .await?;
        self.record(kind, joined, true);
        Ok(joined)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key is judged not recovered only when no poll of the last span
    /// found it running: one that ran within it (a move between its stop
    /// and its start), or was first found missing after the last poll, is
    /// not.
    #[test]
    fn only_keys_missing_through_the_span_are_not_recovered() {
        let now = Instant::now();
        let ttl = Duration::from_secs(1);
        let since: BTreeMap<String, Instant> = [
            ("lost".to_string(), now - Duration::from_secs(5)),
            ("exactly".to_string(), now - ttl),
            ("moving".to_string(), now - Duration::from_millis(40)),
        ]
        .into_iter()
        .collect();
        let not_running = ["exactly", "lost", "moving", "unpolled"].map(String::from);
        let (missing, moving) = missing_for(not_running.to_vec(), &since, now, ttl);
        assert_eq!(missing, ["exactly", "lost"]);
        assert_eq!(moving, ["moving", "unpolled"]);
    }
}
