//! The fault schedule: each round injects every kind once, in an order
//! shuffled by the seed; one fault at a time, each followed by a wait for
//! recovery (every key believed running runs again on a member that is up).

use std::time::Duration;

use flotilla_testkit::ProxyMode;
use nix::sys::signal::Signal;
use rand::Rng;
use rand::seq::SliceRandom;
use tokio::time::Instant;

use super::fleet::Health;
use super::{ChaosError, Run};
use crate::ledger::{FaultKind, Record};

/// How many of the keys that came back last a worst recovery names.
const LAST_KEYS_SHOWN: usize = 5;

/// The ways a link fails in which Redis hears nothing from the worker:
/// refused (a crashed peer), black-holed, frozen.
pub(super) const SILENT_FAILURES: [ProxyMode; 3] =
    [ProxyMode::Refuse, ProxyMode::BlackHole, ProxyMode::Freeze];

/// Those and a deaf link (commands run, replies held).
const LINK_FAILURES: [ProxyMode; 4] = [
    ProxyMode::Refuse,
    ProxyMode::BlackHole,
    ProxyMode::Freeze,
    ProxyMode::Deaf,
];

impl Run {
    /// Injects faults until `end`.
    pub(crate) async fn inject_until(&mut self, end: Instant) -> Result<(), ChaosError> {
        let mut round: Vec<FaultKind> = Vec::new();
        // Let the load fill the pool first.
        tokio::time::sleep(self.options.fault_gap * 2).await;
        while Instant::now() < end {
            if round.is_empty() {
                round = self.options.faults.clone();
                if round.is_empty() {
                    tokio::time::sleep_until(end).await;
                    break;
                }
                round.shuffle(&mut self.rng);
            }
            let Some(drawn) = round.pop() else { continue };
            let kind = self.adjust(drawn);
            // A process added or removed in place of the kind drawn keeps
            // the fleet's size even when that is not among the faults
            // asked for: skipping it left a fleet one short of its size,
            // and every removal kind after the first skipped in turn.
            if kind != drawn || self.options.faults.contains(&kind) {
                self.inject(kind).await?;
            }
            if !self.options.overlap {
                tokio::time::sleep(self.options.fault_gap).await;
            }
        }
        if self.options.overlap {
            // The last fault's recovery, however many it overlapped, must
            // end within the usual limit.
            let since = Instant::now();
            let mut recovered = None;
            self.still_missing.clear();
            self.observe(
                since,
                since + self.options.recovery_limit,
                true,
                &mut recovered,
            )
            .await;
            if recovered.is_none() {
                self.keys_not_recovered(format!(
                    "overlapping faults: not recovered within {:?} of the last",
                    self.options.recovery_limit
                ));
            }
        }
        Ok(())
    }

    /// Keeps the fleet between `n - 1` and `n + 1` processes (and never
    /// below two up).
    fn adjust(&self, kind: FaultKind) -> FaultKind {
        let n = self.fleet.members.len();
        let target = self.options.worker_processes;
        match kind {
            FaultKind::Kill
            | FaultKind::RemoveWorker
            | FaultKind::CutRemove
            | FaultKind::PauseRemove
            | FaultKind::StopLeave
            | FaultKind::LossKill
                if n < target || n <= 2 =>
            {
                FaultKind::AddWorker
            }
            FaultKind::Pause
            | FaultKind::Cut
            | FaultKind::Slow
            | FaultKind::Flap
            | FaultKind::CutOne
            | FaultKind::Deaf
            | FaultKind::CutRollback
            | FaultKind::CutRestartEmpty
            | FaultKind::CutFlushJoin
            | FaultKind::PauseRollback
            | FaultKind::CutRemove
            | FaultKind::PauseRemove
            | FaultKind::Drain
                if self.fleet.up().len() <= 2 =>
            {
                FaultKind::AddWorker
            }
            FaultKind::AddWorker if n > target => FaultKind::RemoveWorker,
            k => k,
        }
    }

    pub(super) fn record(&self, kind: FaultKind, target: Option<u32>, end: bool) {
        self.ledger.record(Record::Fault { kind, target, end });
    }

    pub(super) fn pick_up(&mut self) -> Option<u32> {
        let up = self.fleet.up();
        if up.is_empty() {
            return None;
        }
        Some(up[self.rng.random_range(0..up.len())])
    }

    async fn inject(&mut self, kind: FaultKind) -> Result<(), ChaosError> {
        self.still_missing.clear();
        let mut since = Instant::now();
        let ttl = self.options.ttl;
        let mut recovered = None;
        let mut target = None;
        match kind {
            FaultKind::Kill => {
                let Some(pid) = self.pick_up() else {
                    return Ok(());
                };
                target = Some(pid);
                if let Some(m) = self.fleet.member(pid) {
                    m.process.signal(Signal::SIGKILL)?;
                }
                // Recorded once the signal is sent: the process runs no
                // more user code after that.
                self.record(kind, Some(pid), false);
                if let Some(mut m) = self.fleet.forget(pid) {
                    let _ = m.process.sigkill().await;
                }
            }
            FaultKind::Pause => {
                let Some(pid) = self.pick_up() else {
                    return Ok(());
                };
                target = Some(pid);
                if let Some(m) = self.fleet.member(pid) {
                    m.process.signal(Signal::SIGSTOP)?;
                    m.health = Health::Paused;
                }
                self.record(kind, Some(pid), false);
                // Longer than the TTL: the pool must move its jobs, and the
                // process must stop them itself when it resumes.
                self.observe(since, since + ttl * 2, false, &mut recovered)
                    .await;
                self.record(kind, Some(pid), true);
                if let Some(m) = self.fleet.member(pid) {
                    m.process.signal(Signal::SIGCONT)?;
                    m.health = Health::Up;
                }
            }
            FaultKind::PauseRollback => {
                let snapshot = self.on_server(|s| s.save_snapshot()).await?;
                let Some(pid) = self.pause_busiest(kind)? else {
                    return Ok(());
                };
                target = Some(pid);
                let paused_at = Instant::now();
                let lost = Duration::from_millis(self.rng.random_range(500..=1500));
                tokio::time::sleep(lost).await;
                // The rollback is recorded as a fault of its own too (as in
                // a cut's), so the checker knows when, within the pause,
                // Redis lost the writes made since the snapshot: a key
                // admitted during the pause is lost by it (seed 1404).
                self.record(FaultKind::Rollback, None, false);
                self.on_server(move |s| s.roll_back(&snapshot)).await?;
                self.record(FaultKind::Rollback, None, true);
                self.observe(since, paused_at + ttl * 2, false, &mut recovered)
                    .await;
                self.record(kind, Some(pid), true);
                if let Some(m) = self.fleet.member(pid) {
                    m.process.signal(Signal::SIGCONT)?;
                    m.health = Health::Up;
                }
                since = Instant::now();
            }
            FaultKind::Cut => {
                // A live partition of the process that holds the most jobs:
                // it keeps running, and must stop all of them before anyone
                // else may start them. The three ways a link fails rotate.
                let mode = SILENT_FAILURES[self.cuts % SILENT_FAILURES.len()];
                self.cuts += 1;
                target = self
                    .hold_busiest_link(kind, mode, since, ttl * 2, &mut recovered)
                    .await;
                if target.is_none() {
                    return Ok(());
                }
            }
            FaultKind::Slow => {
                // A gray failure: the link works, too slowly for the
                // renewals to come back in time, while those the client
                // gave up on still reach Redis, late (renewing nothing
                // once the node has heard no reply for a TTL).
                let delay = self.rng.random_range(ttl / 4..=ttl);
                target = self
                    .hold_busiest_link(
                        kind,
                        ProxyMode::Delay(delay),
                        since,
                        ttl * 2,
                        &mut recovered,
                    )
                    .await;
                if target.is_none() {
                    return Ok(());
                }
                since = Instant::now();
            }
            FaultKind::Flap => {
                // A link that fails and heals again and again: renewals
                // get through now and then, replies are cut off mid-way,
                // and the worker stops, resumes and loses its jobs in
                // quick turns while others may take them over.
                let Some(pid) = self.degrade_busiest_link(kind, ProxyMode::Refuse) else {
                    return Ok(());
                };
                target = Some(pid);
                let end = since + ttl * 3;
                let mut down = true;
                loop {
                    let hold = self.rng.random_range(ttl / 40..=ttl * 2 / 5);
                    let next = (Instant::now() + hold).min(end);
                    self.observe(since, next, false, &mut recovered).await;
                    if next >= end {
                        break;
                    }
                    down = !down;
                    let mode = if down {
                        LINK_FAILURES[self.rng.random_range(0..LINK_FAILURES.len())]
                    } else {
                        ProxyMode::Forward
                    };
                    if let Some(m) = self.fleet.member(pid) {
                        m.proxy.set_mode(mode);
                    }
                }
                self.heal_link(kind, pid);
                since = Instant::now();
            }
            FaultKind::CutOne => {
                // A partial failure: one of the busiest process's
                // connections fails while the others work (its renewals
                // may go on while its blocking reads or its change
                // messages stall, or the reverse).
                self.fleet.refresh();
                let Some(pid) = self.fleet.busiest_up() else {
                    return Ok(());
                };
                let mode = LINK_FAILURES[self.rng.random_range(0..LINK_FAILURES.len())];
                let Some(m) = self.fleet.member(pid) else {
                    return Ok(());
                };
                let open = m.proxy.connections();
                if open.is_empty() {
                    return Ok(());
                }
                let id = open[self.rng.random_range(0..open.len())];
                m.proxy.set_mode_of(id, mode);
                m.health = Health::Cut;
                target = Some(pid);
                self.record(kind, Some(pid), false);
                self.observe(since, since + ttl * 2, false, &mut recovered)
                    .await;
                self.heal_link(kind, pid);
                since = Instant::now();
            }
            FaultKind::Deaf => {
                // A one-way failure: the worker's renewals still reach
                // Redis, while it hears no reply and stops its jobs itself.
                // Redis must stop counting renewals from a node that hears
                // nothing, so that its jobs move on within the usual
                // recovery limit, timed from the failure as for a cut, not
                // from the heal; once healed, the held replies arrive late.
                target = self
                    .hold_busiest_link(kind, ProxyMode::Deaf, since, ttl * 3, &mut recovered)
                    .await;
                if target.is_none() {
                    return Ok(());
                }
            }
            FaultKind::CutRemove => {
                // A graceful stop the worker cannot carry out: its link
                // fails, it is told to stop while cut off, and the link
                // heals while it closes, so its hand-overs and stops reach
                // Redis late or never, after others may have taken its
                // jobs. Timed from the failure, as a cut.
                let mode = LINK_FAILURES[self.rng.random_range(0..LINK_FAILURES.len())];
                let Some(pid) = self.degrade_busiest_link(kind, mode) else {
                    return Ok(());
                };
                target = Some(pid);
                let term_at = since + self.rng.random_range(Duration::ZERO..=ttl);
                self.observe(since, term_at, false, &mut recovered).await;
                if let Some(m) = self.fleet.member(pid) {
                    m.process.signal(Signal::SIGTERM)?;
                }
                self.record(FaultKind::RemoveWorker, Some(pid), false);
                let heal_at = Instant::now() + self.rng.random_range(Duration::ZERO..=ttl * 2);
                self.observe(since, heal_at, false, &mut recovered).await;
                if let Some(m) = self.fleet.member(pid) {
                    m.proxy.heal();
                }
                self.record(kind, Some(pid), true);
                self.await_removal(pid).await?;
            }
            FaultKind::PauseRemove => {
                // A process told to stop while frozen: it wakes to a lapsed
                // lease (its watchdog stops its jobs) and to a close that
                // hands them over, at once. Timed from the pause.
                let Some(pid) = self.pause_busiest(kind)? else {
                    return Ok(());
                };
                target = Some(pid);
                let wake_at = since + self.rng.random_range(Duration::ZERO..=ttl * 2);
                self.observe(since, wake_at, false, &mut recovered).await;
                // Both ends recorded before the SIGCONT, as a pause's: what
                // the process records after it comes after them.
                if let Some(m) = self.fleet.member(pid) {
                    m.process.signal(Signal::SIGTERM)?;
                }
                self.record(kind, Some(pid), true);
                self.record(FaultKind::RemoveWorker, Some(pid), false);
                if let Some(m) = self.fleet.member(pid) {
                    m.process.signal(Signal::SIGCONT)?;
                }
                self.await_removal(pid).await?;
            }
            FaultKind::CutDispatcher => {
                // The workers are untouched: what must hold is that a
                // dispatcher whose replies come late or never admits
                // nothing twice and loses nothing, and works again after.
                if self.dispatcher_proxies.is_empty() {
                    return Ok(());
                }
                let i = self.rng.random_range(0..self.dispatcher_proxies.len());
                let mode = LINK_FAILURES[self.rng.random_range(0..LINK_FAILURES.len())];
                let hold = self.rng.random_range(ttl / 2..=ttl * 3);
                self.dispatcher_proxies[i].set_mode(mode);
                self.record(kind, None, false);
                self.observe(since, since + hold, false, &mut recovered)
                    .await;
                self.dispatcher_proxies[i].heal();
                self.record(kind, None, true);
                since = Instant::now();
            }
            FaultKind::JoinKill => {
                // A process that dies while it joins: its workers may have
                // registered, and taken jobs the others handed over, when
                // it is killed; those must run again elsewhere.
                let addr = self.server_addr()?;
                self.record(kind, None, false);
                let (mut starting, _proxy) = self.fleet.start(addr).await?;
                let pid = starting.pid();
                target = Some(pid);
                let kill_at = Instant::now()
                    + self
                        .rng
                        .random_range(Duration::ZERO..=Duration::from_millis(1500));
                if tokio::time::timeout_at(kill_at, starting.ready_line())
                    .await
                    .is_ok()
                {
                    tokio::time::sleep_until(kill_at).await;
                }
                // Recorded once the signal is sent, as a kill.
                let reaped = starting.sigkill().await;
                self.fleet.ended(pid);
                self.record(FaultKind::Kill, Some(pid), false);
                self.record(kind, Some(pid), true);
                reaped?;
                since = Instant::now();
            }
            FaultKind::CutRollback | FaultKind::CutRestartEmpty | FaultKind::CutFlushJoin => {
                let rollback = kind == FaultKind::CutRollback;
                let flush = kind == FaultKind::CutFlushJoin;
                let snapshot = if rollback {
                    Some(self.on_server(|s| s.save_snapshot()).await?)
                } else {
                    None
                };
                let Some(pid) = self.degrade_busiest_link(kind, ProxyMode::BlackHole) else {
                    return Ok(());
                };
                target = Some(pid);
                let cut_at = Instant::now();
                // Work Redis will lose, on the other workers, while the cut
                // one still runs its jobs under its lease.
                let lost = Duration::from_millis(self.rng.random_range(500..=1500));
                tokio::time::sleep(lost).await;
                // The loss is recorded as a fault of its own too (as
                // `stop-leave` does), so the checker knows when, within the
                // cut, Redis lost its data, not only that it did by the heal.
                let loss = match (rollback, flush) {
                    (true, _) => FaultKind::Rollback,
                    (_, true) => FaultKind::Flush,
                    _ => FaultKind::RestartEmpty,
                };
                self.record(loss, None, false);
                self.on_server(move |s| match &snapshot {
                    Some(snapshot) => s.roll_back(snapshot),
                    None if flush => s.flush_all(),
                    None => s.restart_empty(),
                })
                .await?;
                self.record(loss, None, true);
                if flush {
                    // At once: the new process may be the first to reach
                    // Redis after the flush.
                    let joined = self.fleet.add(self.server_addr()?).await?;
                    self.record(FaultKind::AddWorker, Some(joined), false);
                    self.record(FaultKind::AddWorker, Some(joined), true);
                }
                self.observe(since, cut_at + ttl * 2, false, &mut recovered)
                    .await;
                self.heal_link(kind, pid);
                since = Instant::now();
            }
            FaultKind::RestartAof | FaultKind::RestartEmpty => {
                self.record(kind, None, false);
                let empty = kind == FaultKind::RestartEmpty;
                self.on_server(move |s| {
                    if empty {
                        s.restart_empty()
                    } else {
                        s.kill();
                        s.start_again()
                    }
                })
                .await?;
                self.record(kind, None, true);
            }
            FaultKind::Flush => {
                self.record(kind, None, false);
                self.on_server(|s| s.flush_all()).await?;
                self.record(kind, None, true);
            }
            FaultKind::Rollback => {
                let snapshot = self.on_server(|s| s.save_snapshot()).await?;
                // Normal work (the load goes on) that Redis will lose.
                let lost = Duration::from_millis(self.rng.random_range(2000..=4000));
                tokio::time::sleep(lost).await;
                self.record(kind, None, false);
                since = Instant::now();
                self.on_server(move |s| s.roll_back(&snapshot)).await?;
                self.record(kind, None, true);
            }
            FaultKind::OutageThenKill => {
                self.record(kind, None, false);
                let down = Duration::from_millis(self.rng.random_range(2000..=3000));
                self.on_server(move |s| {
                    s.kill();
                    std::thread::sleep(down);
                    s.start_again()
                })
                .await?;
                // The workers resume their suspended jobs; then one dies.
                tokio::time::sleep(Duration::from_millis(self.rng.random_range(1000..=3000))).await;
                target = self.kill_busiest().await?;
                since = Instant::now();
                self.record(kind, None, true);
            }
            FaultKind::FreezeRedis => {
                let pid = self
                    .server
                    .lock()
                    .ok()
                    .and_then(|s| s.pid())
                    .ok_or_else(|| {
                        flotilla_testkit::Error::Startup("no redis-server pid to freeze".into())
                    })?;
                let frozen = self.rng.random_range(ttl / 2..=ttl * 2);
                let signal = |signal: Signal| {
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal)
                        .map_err(|e| crate::process::ProcessError::Signal(signal, pid, e))
                };
                signal(Signal::SIGSTOP)?;
                self.record(kind, None, false);
                tokio::time::sleep(frozen).await;
                // Recorded before the server runs again: from here on it
                // may answer.
                self.record(kind, None, true);
                signal(Signal::SIGCONT)?;
                since = Instant::now();
            }
            FaultKind::Failover => {
                if self.sentinels.is_none() {
                    return Ok(());
                }
                self.record(kind, None, false);
                since = Instant::now();
                let old = self
                    .on_sentinels(|ha| {
                        let old = ha.kill_primary()?;
                        ha.wait_for_failover(old, Duration::from_secs(30))?;
                        Ok(old)
                    })
                    .await?;
                self.record(kind, None, true);
                self.failed_primary = old;
            }
            FaultKind::AddWorker => {
                let addr = self.server_addr()?;
                let pid = self.fleet.add(addr).await?;
                // Recovery counts from the moment it is registered.
                since = Instant::now();
                target = Some(pid);
                self.record(kind, Some(pid), false);
                self.record(kind, Some(pid), true);
            }
            FaultKind::StopLeave => {
                let loss = [
                    FaultKind::Flush,
                    FaultKind::RestartEmpty,
                    FaultKind::Rollback,
                ][self.rng.random_range(0..3)];
                // A rollback goes back to before the stops (and after the
                // hand-offs that brought the jobs to the process).
                let snapshot = if loss == FaultKind::Rollback {
                    Some(self.on_server(|s| s.save_snapshot()).await?)
                } else {
                    None
                };
                let Some(pid) = self.stop_and_leave().await? else {
                    return Ok(());
                };
                target = Some(pid);
                let wait = Duration::from_millis(self.rng.random_range(0..=2000));
                tokio::time::sleep(wait).await;
                self.record(loss, None, false);
                since = Instant::now();
                self.on_server(move |s| match &snapshot {
                    Some(snapshot) => s.roll_back(snapshot),
                    None if loss == FaultKind::Flush => s.flush_all(),
                    None => s.restart_empty(),
                })
                .await?;
                self.record(loss, None, true);
            }
            FaultKind::RollbackTwice => {
                self.rollback_twice().await?;
                since = Instant::now();
            }
            FaultKind::LossKill => {
                target = self.loss_then_kill().await?;
                since = Instant::now();
            }
            FaultKind::OutOfMemory | FaultKind::ReadOnly => {
                self.refuse_writes(kind).await?;
                since = Instant::now();
            }
            FaultKind::PauseWrites => {
                self.pause_writes().await?;
                since = Instant::now();
            }
            FaultKind::DropClients => {
                self.drop_clients().await?;
                since = Instant::now();
            }
            FaultKind::RestartDispatcher => {
                // Boxed: a node's join and close are large futures, and
                // this one's state would sit in every fault's.
                Box::pin(self.restart_dispatcher()).await?;
                since = Instant::now();
            }
            FaultKind::RemoveWorker => {
                let Some(pid) = self.pick_up() else {
                    return Ok(());
                };
                target = Some(pid);
                self.record(kind, Some(pid), false);
                self.await_removal(pid).await?;
            }
            FaultKind::ClockStep => {
                self.step_server_clock().await?;
                since = Instant::now();
            }
            FaultKind::FrozenFailover => {
                target = self.frozen_failover().await?;
                since = Instant::now();
            }
            FaultKind::RollbackFar => {
                target = self.rollback_far().await?;
                since = Instant::now();
            }
            FaultKind::Drain => {
                target = self.drain_busiest(since, &mut recovered).await?;
                if target.is_none() {
                    return Ok(());
                }
                since = Instant::now();
            }
        }
        *self.faults.entry(kind).or_default() += 1;
        let limit = if self.options.overlap {
            since + self.rng.random_range(Duration::ZERO..=ttl * 2)
        } else {
            since + self.options.recovery_limit
        };
        self.observe(since, limit, true, &mut recovered).await;
        if let Some(port) = self.failed_primary.take() {
            // The old primary returns as a replica, for the next failover.
            self.on_sentinels(move |ha| ha.restart_as_replica(port, Duration::from_secs(30)))
                .await?;
        }
        match recovered {
            Some(d) => {
                let worst = self.recovery.entry(kind).or_default();
                if d >= *worst {
                    *worst = d;
                    let last = std::mem::take(&mut self.still_missing)
                        .into_keys()
                        .take(LAST_KEYS_SHOWN)
                        .collect();
                    self.last_to_recover.insert(kind, last);
                }
            }
            // The next fault lands during this recovery: only the final
            // check counts.
            None if self.options.overlap => {}
            None => {
                self.keys_not_recovered(format!(
                    "{} (pid {:?}) at {:.1} s: not recovered within {:?}",
                    kind.name(),
                    target,
                    since.elapsed().as_secs_f64(),
                    self.options.recovery_limit,
                ));
            }
        }
        Ok(())
    }
}
