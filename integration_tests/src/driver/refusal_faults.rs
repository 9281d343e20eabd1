//! Faults in which Redis keeps running and keeps its data but refuses
//! work: writes refused (out of memory, or a read-only replica), writes
//! held (a client pause), and every client's connection closed at once.
//! Nobody can renew a lease or take a job while writes are refused or
//! held, so recovery is timed from the moment Redis takes writes again.

use std::time::Duration;

use flotilla_testkit::WriteRefusal;
use rand::Rng;

use super::{ChaosError, Run};
use crate::ledger::FaultKind;

impl Run {
    /// [`FaultKind::OutOfMemory`] and [`FaultKind::ReadOnly`]: returns once
    /// Redis takes writes again.
    pub(super) async fn refuse_writes(&mut self, kind: FaultKind) -> Result<(), ChaosError> {
        let refusal = if kind == FaultKind::ReadOnly {
            WriteRefusal::ReadOnlyReplica
        } else {
            WriteRefusal::OutOfMemory
        };
        let ttl = self.options.ttl;
        let hold = self.rng.random_range(ttl / 4..=ttl * 5 / 2);
        self.on_server(move |s| s.refuse_writes(refusal)).await?;
        self.record(kind, None, false);
        tokio::time::sleep(hold).await;
        // Recorded before the writes come back: from here on they may land.
        self.record(kind, None, true);
        self.on_server(move |s| s.accept_writes(refusal)).await?;
        Ok(())
    }

    /// [`FaultKind::PauseWrites`]: returns once Redis runs writes again.
    pub(super) async fn pause_writes(&mut self) -> Result<(), ChaosError> {
        let ttl = self.options.ttl;
        let hold = self.rng.random_range(ttl / 2..=ttl * 2);
        // The pause also ends by itself a TTL later, should the unpause
        // below not get through.
        let limit = u64::try_from((hold + ttl).as_millis()).unwrap_or(u64::MAX);
        self.on_server(move |s| s.pause_writes(limit)).await?;
        self.record(FaultKind::PauseWrites, None, false);
        tokio::time::sleep(hold).await;
        // Recorded before the writes run: from here on they may land.
        self.record(FaultKind::PauseWrites, None, true);
        self.on_server(|s| s.unpause()).await?;
        Ok(())
    }

    /// [`FaultKind::DropClients`]: every connection closed 1–3 times, up to
    /// half a TTL apart; returns after the last.
    pub(super) async fn drop_clients(&mut self) -> Result<(), ChaosError> {
        let ttl = self.options.ttl;
        let times = self.rng.random_range(1..=3);
        self.record(FaultKind::DropClients, None, false);
        for i in 0..times {
            if i > 0 {
                let gap = self.rng.random_range(Duration::ZERO..=ttl / 2);
                tokio::time::sleep(gap).await;
            }
            self.on_server(|s| s.drop_clients()).await?;
        }
        self.record(FaultKind::DropClients, None, true);
        Ok(())
    }
}
