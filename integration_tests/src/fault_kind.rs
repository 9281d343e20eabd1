//! The faults a chaos run injects, as its ledgers name them.

use serde::{Deserialize, Serialize};

/// Faults the driver injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// `SIGKILL` of a worker process.
    Kill,
    /// `SIGSTOP` of a worker process; `SIGCONT` ends it.
    Pause,
    /// The worker's proxy cuts its Redis connection; heal ends it.
    Cut,
    /// Redis killed and restarted with its AOF.
    RestartAof,
    /// Redis killed and restarted with its data gone.
    RestartEmpty,
    /// A worker process added.
    AddWorker,
    /// A worker process closed gracefully (`SIGTERM` → `Node::close`).
    RemoveWorker,
    /// Redis goes back in time: a snapshot, 2–4 s of normal work, then Redis
    /// killed and started again from the snapshot (what a replica promotion
    /// with lost writes or an `everysec` AOF crash does).
    Rollback,
    /// A sequence: Redis down for 2–3 s (longer than the workers' lease
    /// stop, so every worker suspends its jobs), started again with its
    /// AOF, then 1–3 s later `SIGKILL` of the busiest worker process.
    OutageThenKill,
    /// Against a Sentinel deployment: `SIGKILL` of the primary; Sentinel
    /// promotes the replica (what was not replicated yet is lost); the old
    /// primary comes back as a replica.
    Failover,
    /// Redis frozen (`SIGSTOP` of the server) for 0.5–2 worker TTLs, then
    /// `SIGCONT`: connections stay open and silent, every call times out,
    /// and the commands queued meanwhile run late, all at once, on a server
    /// whose clock moved on (a stalled VM, a swapping host).
    FreezeRedis,
    /// The busiest worker's link slowed down (each byte delivered 0.25–1
    /// worker TTL late, each way) for 2 TTLs, then healed: commands its
    /// client gave up on still reach Redis, late, and replies to those it
    /// waits for carry an old server time.
    Slow,
    /// A snapshot of Redis, then a live partition (black hole) of the
    /// busiest worker, then Redis goes back to the snapshot while that
    /// worker is still cut off (it cannot re-assert what it runs); healed
    /// 2 TTLs after the cut.
    CutRollback,
    /// The same with Redis restarted without its data instead: the cut
    /// worker's jobs survive only in that worker, which must re-assert
    /// them once it is back.
    CutRestartEmpty,
    /// A snapshot of Redis, then `SIGSTOP` of the busiest worker process,
    /// then Redis goes back to the snapshot while it is stopped; `SIGCONT`
    /// 2 TTLs after the pause: it wakes to a server that forgot part of
    /// what it ran, and a lease that lapsed while it slept.
    PauseRollback,
    /// The busiest worker's link fails and comes back again and again for
    /// 3 TTLs (each state held 1/40 to 2/5 of a TTL; the failures rotate
    /// refuse, black hole and freeze): some renewals get through and some
    /// do not, commands are cut off mid-way, and the worker stops, resumes
    /// and loses its jobs in quick turns while it reconnects.
    Flap,
    /// One connection of the busiest worker process fails alone for
    /// 2 TTLs (refused, black-holed or frozen, at random), picked at
    /// random among those open (its command connection, its
    /// subscriptions' or its blocking reads'), while its other
    /// connections, and any it opens meanwhile, work.
    CutOne,
    /// The busiest worker's link goes deaf for 3 TTLs: its commands reach
    /// Redis and run (renewals, starts, re-assertions), their replies are
    /// held until the heal and then arrive late, in order (a one-way
    /// failure: Redis receives the renewals of a worker that hears
    /// nothing). Its jobs must run elsewhere within the recovery limit from
    /// the failure, as for a cut.
    Deaf,
    /// A graceful stop of a cut-off worker: the busiest worker's link fails
    /// (refused, black-holed, frozen or deaf, at random), 0–1 TTL later the
    /// process gets `SIGTERM`, and 0–2 TTLs after that the link heals while
    /// its node closes: the close's hand-overs and stops reach Redis late
    /// or never, after its lease lapsed and others took its jobs. Its stop
    /// is recorded as a [`FaultKind::RemoveWorker`] of the same process.
    CutRemove,
    /// A new worker process `SIGKILL`ed while it joins (0–1.5 s after it
    /// was started, before or just after it is ready): its workers may have
    /// registered and taken jobs handed over by the others. The kill is
    /// recorded as a [`FaultKind::Kill`] of the process.
    JoinKill,
    /// A graceful stop of a frozen worker: `SIGSTOP` of the busiest worker
    /// process, `SIGTERM` 0–2 TTLs later (pending while it is stopped),
    /// `SIGCONT` at once: it wakes to a lapsed lease and a close to carry
    /// out, its watchdog and its close racing for the same jobs. Its stop
    /// is recorded as a [`FaultKind::RemoveWorker`] from the `SIGCONT`.
    PauseRemove,
    /// One of the two dispatching nodes' link fails (refused, black-holed,
    /// frozen or deaf, at random) for 0.5–3 TTLs, then heals: its
    /// admissions and stops run or not, their replies come late or never,
    /// its callers time out and dispatch or stop again, and past a TTL the
    /// other nodes may take it for dead.
    CutDispatcher,
    /// Redis's data deleted (`FLUSHALL`) while it keeps running: lost as by
    /// an empty restart, but with the same run id and every connection
    /// open, so only the pool's own records (its epoch) show the loss.
    Flush,
    /// A command-line client: a client-only node joins, stops up to five
    /// jobs of the newest worker process (most of which came to it by
    /// hand-offs) and closes; that process is then removed (`SIGTERM`),
    /// and 0–2 s later Redis loses its data (a `FLUSHALL`, an empty
    /// restart, or a rollback to a snapshot taken before the stops;
    /// recorded as that fault). Of the processes that saw those stops,
    /// only the workers the removed process left its memory with on its
    /// way out remain (and the workers that had handed it the jobs, if an
    /// earlier stop-leave did not remove them): they must not give the
    /// jobs back, and must make their ends stand over a state that shows
    /// them running.
    StopLeave,
    /// The busiest worker's link black-holed, then 0.5–1.5 s later Redis
    /// loses its data while it keeps running (`FLUSHALL`) and a new worker
    /// process joins at once: only the pool's epoch shows the loss, the
    /// cut-off worker still runs its jobs under its lease, and the new
    /// process may be the first to reach Redis after the flush. Its join is
    /// recorded as a [`FaultKind::AddWorker`]; the link heals 2 TTLs after
    /// the cut.
    CutFlushJoin,
    /// Redis goes back in time twice: a snapshot, 2–4 s of normal work, a
    /// rollback to it, and 0.2–1 TTL later, while the pool recovers (its
    /// workers re-register and re-assert what they run), a second
    /// rollback: to the same snapshot, or to one taken 0.1–0.5 TTL after
    /// the first rollback. The recovery's own writes (the window it opened,
    /// the re-registrations, the re-assertions) are lost in turn, as when
    /// a failover promotes a replica that lagged behind the failed one.
    RollbackTwice,
    /// A data loss (a rollback to a snapshot 2–4 s old, or an empty
    /// restart, at random), then 0–1 TTL later, while the pool recovers,
    /// `SIGKILL` of the busiest worker process: before or after it
    /// re-asserted its jobs. The loss is recorded as that fault and the
    /// kill as a [`FaultKind::Kill`] of the process.
    LossKill,
    /// Redis out of memory for 0.25–2.5 worker TTLs (`maxmemory` set below
    /// what it uses, policy `noeviction`), then back: every function and
    /// write command gets an `OOM` error while reads and deletions run, so
    /// no lease can be renewed and no job taken; nothing is lost.
    OutOfMemory,
    /// Redis made a read-only replica of a primary that does not answer
    /// for 0.25–2.5 worker TTLs, then a primary again with its data: every
    /// write gets `READONLY`, reads run, and the blocking reads it served
    /// are dropped when it turns replica.
    ReadOnly,
    /// Redis holds every write for 0.5–2 worker TTLs (`CLIENT PAUSE …
    /// WRITE`, what a `FAILOVER` command or an operator's pause does):
    /// reads, blocking reads of the inboxes and published messages go on
    /// while every function call (renewals, starts, admissions, cleanups)
    /// waits unanswered; then the held calls run all at once, late, in
    /// order, on a server whose clock moved on. Nothing is lost.
    PauseWrites,
    /// Redis closes every client's connection, 1–3 times 0–0.5 TTL apart
    /// (a proxy or load balancer in front of it restarting): commands in
    /// flight may or may not have run, and subscribers miss what is
    /// published until they subscribe again.
    DropClients,
    /// One of the two dispatching nodes goes away while its calls are in
    /// flight (its dispatches and stops wait for answers) and 0–1 TTL
    /// later comes back under the same node id (a pod name): answers to
    /// the earlier run's requests keep arriving on the reply stream both
    /// runs share, and must not answer the new run's requests.
    RestartDispatcher,
    /// The Redis host's wall clock steps (an NTP step, a resumed virtual
    /// machine): forward 1–30 s two times in three, else back 0.2–1 TTL.
    /// `TIME`, scripts and key expiry follow at once, the monotonic clocks
    /// do not: every keep-alive looks a step older (or younger) than it is
    /// until its worker's next renewal.
    ClockStep,
    /// Against a Sentinel deployment: `SIGSTOP` of the primary; Sentinel
    /// promotes the replica while the old primary's clients keep their
    /// connections to it, open and silent; a worker process may join
    /// meanwhile (it finds the new primary); 0.5–2 TTLs after the
    /// promotion the old primary wakes and answers as a primary, to the
    /// clients still connected to it, until a Sentinel turns it into a
    /// replica (its writes meanwhile are lost): two primaries at once.
    FrozenFailover,
    /// Redis goes back far: a snapshot, 8–25 s of normal work in which the
    /// fleet changes once (the busiest worker process killed, one removed,
    /// or one added; recorded as that fault), then a rollback to the
    /// snapshot (recorded as a [`FaultKind::Rollback`] too). The records
    /// come back naming a dead worker again, or not knowing a live one,
    /// and of every key moved, finished or dispatched in between the
    /// older state.
    RollbackFar,
    /// An operator drains one worker, or every worker, of the busiest
    /// process (`Node::drain_worker` on a dispatching node): its jobs hand
    /// off to the others; with half the drains the process's link fails
    /// (recorded as a [`FaultKind::Cut`]) while it hands them off; 1–3
    /// TTLs later the workers are undrained and take their share back.
    Drain,
}

impl FaultKind {
    /// Every kind, in schedule order.
    pub const ALL: [FaultKind; 36] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Cut,
        FaultKind::RestartAof,
        FaultKind::RestartEmpty,
        FaultKind::AddWorker,
        FaultKind::RemoveWorker,
        FaultKind::Rollback,
        FaultKind::OutageThenKill,
        FaultKind::Failover,
        FaultKind::FreezeRedis,
        FaultKind::Slow,
        FaultKind::CutRollback,
        FaultKind::CutRestartEmpty,
        FaultKind::PauseRollback,
        FaultKind::Flap,
        FaultKind::CutOne,
        FaultKind::Deaf,
        FaultKind::CutRemove,
        FaultKind::JoinKill,
        FaultKind::PauseRemove,
        FaultKind::CutDispatcher,
        FaultKind::Flush,
        FaultKind::StopLeave,
        FaultKind::CutFlushJoin,
        FaultKind::RollbackTwice,
        FaultKind::LossKill,
        FaultKind::OutOfMemory,
        FaultKind::ReadOnly,
        FaultKind::PauseWrites,
        FaultKind::DropClients,
        FaultKind::RestartDispatcher,
        FaultKind::ClockStep,
        FaultKind::FrozenFailover,
        FaultKind::RollbackFar,
        FaultKind::Drain,
    ];

    /// Whether Redis loses writes in this fault: restarted empty, rolled
    /// back to a snapshot, or a failover to a replica that lacked the
    /// last writes (the AOF restarts sync every write: nothing lost).
    pub fn loses_data(self) -> bool {
        matches!(
            self,
            FaultKind::RestartEmpty
                | FaultKind::Flush
                | FaultKind::Rollback
                | FaultKind::Failover
                | FaultKind::FrozenFailover
                | FaultKind::CutRollback
                | FaultKind::CutRestartEmpty
                | FaultKind::CutFlushJoin
                | FaultKind::PauseRollback
                | FaultKind::RollbackTwice
                | FaultKind::RollbackFar
        )
    }

    /// The kind's command-line name (`kill`, `pause`, `cut`, `restart-aof`,
    /// `restart-empty`, `add`, `remove`, `rollback`, `outage-kill`,
    /// `failover`, `freeze-redis`, `slow`, `cut-rollback`, `cut-empty`,
    /// `pause-rollback`, `flap`, `cut-one`, `deaf`, `cut-remove`,
    /// `join-kill`, `pause-remove`, `cut-dispatcher`, `flush`,
    /// `stop-leave`, `cut-flush-join`, `rollback-twice`, `loss-kill`, `oom`,
    /// `read-only`, `drop-clients`, `restart-dispatcher`, `clock-step`,
    /// `frozen-failover`, `rollback-far`, `drain`, `pause-writes`).
    pub fn cli_name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::Cut => "cut",
            FaultKind::RestartAof => "restart-aof",
            FaultKind::RestartEmpty => "restart-empty",
            FaultKind::AddWorker => "add",
            FaultKind::RemoveWorker => "remove",
            FaultKind::Rollback => "rollback",
            FaultKind::OutageThenKill => "outage-kill",
            FaultKind::Failover => "failover",
            FaultKind::FreezeRedis => "freeze-redis",
            FaultKind::Slow => "slow",
            FaultKind::CutRollback => "cut-rollback",
            FaultKind::CutRestartEmpty => "cut-empty",
            FaultKind::PauseRollback => "pause-rollback",
            FaultKind::Flap => "flap",
            FaultKind::CutOne => "cut-one",
            FaultKind::Deaf => "deaf",
            FaultKind::CutRemove => "cut-remove",
            FaultKind::JoinKill => "join-kill",
            FaultKind::PauseRemove => "pause-remove",
            FaultKind::CutDispatcher => "cut-dispatcher",
            FaultKind::Flush => "flush",
            FaultKind::StopLeave => "stop-leave",
            FaultKind::CutFlushJoin => "cut-flush-join",
            FaultKind::RollbackTwice => "rollback-twice",
            FaultKind::LossKill => "loss-kill",
            FaultKind::OutOfMemory => "oom",
            FaultKind::ReadOnly => "read-only",
            FaultKind::PauseWrites => "pause-writes",
            FaultKind::DropClients => "drop-clients",
            FaultKind::RestartDispatcher => "restart-dispatcher",
            FaultKind::ClockStep => "clock-step",
            FaultKind::FrozenFailover => "frozen-failover",
            FaultKind::RollbackFar => "rollback-far",
            FaultKind::Drain => "drain",
        }
    }

    /// Whether the fault `SIGSTOP`s its target process (which then runs
    /// nothing until `SIGCONT`, its ledger silent meanwhile).
    pub fn pauses_process(self) -> bool {
        matches!(
            self,
            FaultKind::Pause | FaultKind::PauseRollback | FaultKind::PauseRemove
        )
    }

    /// Whether the fault keeps its target process from reaching Redis, or
    /// from running at all, while it lasts (killed, paused, cut off,
    /// slowed past its lease, deaf): it cannot re-assert what it runs.
    pub fn puts_process_out_of_reach(self) -> bool {
        matches!(
            self,
            FaultKind::Kill
                | FaultKind::Pause
                | FaultKind::Cut
                | FaultKind::Slow
                | FaultKind::Deaf
                | FaultKind::CutRollback
                | FaultKind::CutRestartEmpty
                | FaultKind::CutFlushJoin
                | FaultKind::PauseRollback
                | FaultKind::CutRemove
                | FaultKind::PauseRemove
        )
    }

    /// Whether Redis answers no process at all while the fault lasts
    /// (frozen): no process can re-assert what it runs then, as if each
    /// were cut off.
    pub fn answers_no_process(self) -> bool {
        matches!(self, FaultKind::FreezeRedis)
    }

    /// Whether Redis takes no write while the fault lasts (out of memory,
    /// read-only, frozen): no cleanup can move a dead worker's jobs then,
    /// so the failover bound runs only outside such faults.
    pub fn stalls_redis(self) -> bool {
        matches!(
            self,
            FaultKind::OutOfMemory
                | FaultKind::ReadOnly
                | FaultKind::PauseWrites
                | FaultKind::FreezeRedis
                | FaultKind::FrozenFailover
        )
    }

    /// Whether the fault acts on a Sentinel deployment (`--sentinel`).
    pub fn needs_sentinels(self) -> bool {
        matches!(self, FaultKind::Failover | FaultKind::FrozenFailover)
    }

    /// Parses a [`FaultKind::cli_name`].
    pub fn from_cli_name(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.cli_name() == name)
    }

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "sigkill worker",
            FaultKind::Pause => "sigstop/sigcont worker",
            FaultKind::Cut => "cut/heal connection",
            FaultKind::RestartAof => "restart redis (aof)",
            FaultKind::RestartEmpty => "restart redis (no persistence)",
            FaultKind::AddWorker => "add worker process",
            FaultKind::RemoveWorker => "remove worker process",
            FaultKind::Rollback => "rollback redis (2-4 s lost)",
            FaultKind::OutageThenKill => "redis outage, then sigkill",
            FaultKind::Failover => "sentinel failover (sigkill primary)",
            FaultKind::FreezeRedis => "sigstop/sigcont redis",
            FaultKind::Slow => "slow link (0.25-1 TTL each way)",
            FaultKind::CutRollback => "cut worker, rollback redis meanwhile",
            FaultKind::CutRestartEmpty => "cut worker, redis loses its data meanwhile",
            FaultKind::PauseRollback => "sigstop worker, rollback redis meanwhile",
            FaultKind::Flap => "flapping link (down/up every 0.05-0.8 s)",
            FaultKind::CutOne => "one connection of a worker cut",
            FaultKind::Deaf => "deaf link (commands run, replies held)",
            FaultKind::CutRemove => "cut worker, sigterm it meanwhile",
            FaultKind::JoinKill => "sigkill worker while it joins",
            FaultKind::PauseRemove => "sigstop worker, sigterm it meanwhile",
            FaultKind::CutDispatcher => "a dispatcher's link cut",
            FaultKind::Flush => "flushall redis (no restart)",
            FaultKind::StopLeave => "client stops jobs, both leave, data lost",
            FaultKind::CutFlushJoin => "cut worker, flushall, a worker joins at once",
            FaultKind::RollbackTwice => "rollback redis, again while it recovers",
            FaultKind::LossKill => "data loss, sigkill worker while it recovers",
            FaultKind::OutOfMemory => "redis out of memory (writes refused)",
            FaultKind::ReadOnly => "redis a read-only replica (writes refused)",
            FaultKind::PauseWrites => "redis holds writes (client pause write)",
            FaultKind::DropClients => "redis drops every client connection",
            FaultKind::RestartDispatcher => "a dispatcher restarts under its node id",
            FaultKind::ClockStep => "redis's wall clock steps (+1-30 s or -0.2-1 TTL)",
            FaultKind::FrozenFailover => "sentinel failover (sigstop primary, it wakes)",
            FaultKind::RollbackFar => "rollback redis far (8-25 s, the fleet changed)",
            FaultKind::Drain => "drain workers, undrain 1-3 TTLs later",
        }
    }
}
