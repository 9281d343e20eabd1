//! Faults that strike while the pool recovers from a data loss: a second
//! rollback that takes the recovery's own writes with it, and a worker
//! killed before or just after it re-asserted what it runs; and a rollback
//! far back, past a change of the fleet.

use std::time::Duration;

use nix::sys::signal::Signal;
use rand::Rng;

use super::{ChaosError, Run};
use crate::ledger::FaultKind;

impl Run {
    /// [`FaultKind::RollbackTwice`]: returns once Redis is back from the
    /// second rollback.
    pub(super) async fn rollback_twice(&mut self) -> Result<(), ChaosError> {
        let ttl = self.options.ttl;
        let first = self.on_server(|s| s.save_snapshot()).await?;
        // Normal work (the load goes on) that Redis will lose.
        let lost = Duration::from_millis(self.rng.random_range(2000..=4000));
        tokio::time::sleep(lost).await;
        self.record(FaultKind::RollbackTwice, None, false);
        // Each rollback is recorded as a fault of its own too (as in a
        // cut's or a pause's), so the checker knows when Redis lost the
        // writes made between the two: a finish recorded there is lost by
        // the second (seed 1405).
        self.record(FaultKind::Rollback, None, false);
        let first = self
            .on_server(move |s| s.roll_back(&first).map(|()| first))
            .await?;
        self.record(FaultKind::Rollback, None, true);
        // The second loss comes while the workers re-register and
        // re-assert: it takes all of that (back to the first snapshot), or
        // only what came after a snapshot taken part-way through.
        let second = if self.rng.random_bool(0.5) {
            tokio::time::sleep(self.rng.random_range(ttl / 10..=ttl / 2)).await;
            let midway = self.on_server(|s| s.save_snapshot()).await?;
            tokio::time::sleep(self.rng.random_range(ttl / 10..=ttl / 2)).await;
            midway
        } else {
            tokio::time::sleep(self.rng.random_range(ttl / 5..=ttl)).await;
            first
        };
        self.record(FaultKind::Rollback, None, false);
        self.on_server(move |s| s.roll_back(&second)).await?;
        self.record(FaultKind::Rollback, None, true);
        self.record(FaultKind::RollbackTwice, None, true);
        Ok(())
    }

    /// [`FaultKind::RollbackFar`]: returns the process killed, removed or
    /// added in the window Redis loses.
    pub(super) async fn rollback_far(&mut self) -> Result<Option<u32>, ChaosError> {
        let snapshot = self.on_server(|s| s.save_snapshot()).await?;
        let window = Duration::from_millis(self.rng.random_range(8_000..=25_000));
        let began = tokio::time::Instant::now();
        // The fleet changes a quarter to three quarters of the way in:
        // long enough after the snapshot for the pool to have moved the
        // jobs, long enough before the rollback for it to have settled.
        let at = window.mul_f64(self.rng.random_range(0.25..=0.75));
        tokio::time::sleep(at).await;
        self.fleet.refresh();
        let n = self.fleet.members.len();
        let change = if n < self.options.worker_processes || n <= 2 {
            0
        } else {
            self.rng.random_range(0..3)
        };
        let changed = match change {
            0 => {
                let addr = self.server_addr()?;
                let pid = self.fleet.add(addr).await?;
                self.record(FaultKind::AddWorker, Some(pid), false);
                self.record(FaultKind::AddWorker, Some(pid), true);
                Some(pid)
            }
            1 => self.kill_busiest().await?,
            _ => match self.pick_up() {
                Some(pid) => {
                    self.record(FaultKind::RemoveWorker, Some(pid), false);
                    self.await_removal(pid).await?;
                    Some(pid)
                }
                None => None,
            },
        };
        tokio::time::sleep_until(began + window).await;
        self.record(FaultKind::RollbackFar, None, false);
        self.record(FaultKind::Rollback, None, false);
        self.on_server(move |s| s.roll_back(&snapshot)).await?;
        self.record(FaultKind::Rollback, None, true);
        self.record(FaultKind::RollbackFar, None, true);
        Ok(changed)
    }

    /// [`FaultKind::LossKill`]: returns the process killed, if one was (a
    /// fleet of two or fewer is left whole).
    pub(super) async fn loss_then_kill(&mut self) -> Result<Option<u32>, ChaosError> {
        let ttl = self.options.ttl;
        if self.rng.random_bool(0.5) {
            let snapshot = self.on_server(|s| s.save_snapshot()).await?;
            let lost = Duration::from_millis(self.rng.random_range(2000..=4000));
            tokio::time::sleep(lost).await;
            self.record(FaultKind::Rollback, None, false);
            self.on_server(move |s| s.roll_back(&snapshot)).await?;
            self.record(FaultKind::Rollback, None, true);
        } else {
            self.record(FaultKind::RestartEmpty, None, false);
            self.on_server(|s| s.restart_empty()).await?;
            self.record(FaultKind::RestartEmpty, None, true);
        }
        tokio::time::sleep(self.rng.random_range(Duration::ZERO..=ttl)).await;
        self.kill_busiest().await
    }

    /// `SIGKILL` of the process that holds the most jobs, recorded as a
    /// [`FaultKind::Kill`]; none while the fleet has two processes or
    /// fewer.
    pub(super) async fn kill_busiest(&mut self) -> Result<Option<u32>, ChaosError> {
        self.fleet.refresh();
        if self.fleet.members.len() <= 2 {
            return Ok(None);
        }
        let Some(pid) = self.fleet.busiest_up() else {
            return Ok(None);
        };
        if let Some(m) = self.fleet.member(pid) {
            m.process.signal(Signal::SIGKILL)?;
        }
        self.record(FaultKind::Kill, Some(pid), false);
        if let Some(mut m) = self.fleet.forget(pid) {
            let _ = m.process.sigkill().await;
        }
        Ok(Some(pid))
    }
}
