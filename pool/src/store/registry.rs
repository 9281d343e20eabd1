//! The pool's Lua scripts, each prefixed with the rmap and streaming
//! preludes (so one script changes maps and streams atomically while
//! replicas still see every change) and the pool's shared head
//! (`scripts/base.lua`); and the two plain scripts without preludes.

use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;
use fred::types::{FromValue, MultipleKeys, Value};

use crate::error::Result;

/// One loaded script.
#[derive(Debug)]
pub(crate) struct PoolScript {
    name: &'static str,
    script: Script,
}

impl PoolScript {
    fn new(name: &'static str, body: &str) -> Self {
        let src = format!(
            "{}\n{}\n{}\n{}",
            flotilla_rmap::lua::PRELUDE,
            flotilla_streaming::lua::PRELUDE,
            include_str!("scripts/base.lua"),
            body
        );
        PoolScript {
            name,
            script: Script::from_lua(src),
        }
    }

    /// A script without the preludes.
    fn plain(name: &'static str, body: &str) -> Self {
        PoolScript {
            name,
            script: Script::from_lua(body),
        }
    }

    /// Runs the script (EVALSHA, reloading on NOSCRIPT), waiting at most
    /// `timeout` for the answer.
    pub(crate) async fn run<R: FromValue>(
        &self,
        client: &Client,
        keys: Vec<String>,
        args: Vec<Value>,
        timeout: Duration,
    ) -> Result<R> {
        let keys: MultipleKeys = keys.into();
        super::call::script(client, &self.script, self.name, keys, args, timeout).await
    }
}

/// Every script of the pool.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) admit: PoolScript,
    pub(crate) claim_start: PoolScript,
    pub(crate) record_starts: PoolScript,
    pub(crate) started: PoolScript,
    pub(crate) start_failed: PoolScript,
    pub(crate) to_owner: PoolScript,
    pub(crate) stopped: PoolScript,
    pub(crate) handoff: PoolScript,
    pub(crate) move_entry: PoolScript,
    pub(crate) register: PoolScript,
    pub(crate) keepalive: PoolScript,
    pub(crate) reassert: PoolScript,
    pub(crate) resume: PoolScript,
    pub(crate) remove_worker: PoolScript,
    pub(crate) claim_cleanup: PoolScript,
    pub(crate) drain_worker: PoolScript,
    pub(crate) begin_recovery: PoolScript,
    pub(crate) recovery_mark: PoolScript,
    pub(crate) release_stale: PoolScript,
    pub(crate) release_owner: PoolScript,
    pub(crate) handoff_stands: PoolScript,
    pub(crate) stop_stands: PoolScript,
    pub(crate) job_ended: PoolScript,
    pub(crate) job_restart: PoolScript,
    pub(crate) job_forget_failed: PoolScript,
    pub(crate) sweep_orphans: PoolScript,
    pub(crate) requeue_orphan: PoolScript,
    pub(crate) sweep_pending: PoolScript,
    pub(crate) owned_page: PoolScript,
    /// Removes the idempotency marker of an admission whose start was
    /// refused (plain).
    pub(crate) unmark: PoolScript,
    /// Drops a job from a schedule's job set while the caller leads
    /// (plain).
    pub(crate) schedule_forget: PoolScript,
    /// Records a joining node's info with its join time (plain).
    pub(crate) node_info: PoolScript,
    /// Reads the run id of the server holding the pool's keys, and opens
    /// the recovery window when the pool's scripts last ran on another.
    pub(crate) server_id: PoolScript,
}

/// A pool script by its file name.
macro_rules! pool_script {
    ($name:literal) => {
        PoolScript::new($name, include_str!(concat!("scripts/", $name, ".lua")))
    };
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            admit: pool_script!("admit"),
            claim_start: pool_script!("claim_start"),
            record_starts: pool_script!("record_starts"),
            started: pool_script!("started"),
            start_failed: pool_script!("start_failed"),
            to_owner: pool_script!("to_owner"),
            stopped: pool_script!("stopped"),
            handoff: pool_script!("handoff"),
            move_entry: pool_script!("move_entry"),
            register: pool_script!("register"),
            keepalive: pool_script!("keepalive"),
            reassert: pool_script!("reassert"),
            resume: pool_script!("resume"),
            remove_worker: pool_script!("remove_worker"),
            claim_cleanup: pool_script!("claim_cleanup"),
            drain_worker: pool_script!("drain_worker"),
            begin_recovery: pool_script!("begin_recovery"),
            recovery_mark: pool_script!("recovery_mark"),
            release_stale: pool_script!("release_stale"),
            release_owner: pool_script!("release_owner"),
            handoff_stands: pool_script!("handoff_stands"),
            stop_stands: pool_script!("stop_stands"),
            job_ended: pool_script!("job_ended"),
            job_restart: pool_script!("job_restart"),
            job_forget_failed: pool_script!("job_forget_failed"),
            sweep_orphans: pool_script!("sweep_orphans"),
            requeue_orphan: pool_script!("requeue_orphan"),
            sweep_pending: pool_script!("sweep_pending"),
            owned_page: pool_script!("owned_page"),
            unmark: PoolScript::plain("unmark", include_str!("scripts/unmark.lua")),
            schedule_forget: PoolScript::plain(
                "schedule_forget",
                include_str!("scripts/schedule_forget.lua"),
            ),
            node_info: PoolScript::plain("node_info", include_str!("scripts/node_info.lua")),
            server_id: pool_script!("server_id"),
        }
    }
}
