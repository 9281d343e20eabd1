//! The pool's Lua scripts, each prefixed with the rmap and streaming
//! preludes (so one script changes maps and streams atomically while
//! replicas still see every change) and the pool's shared head
//! (`scripts/base.lua`).

use fred::prelude::*;
use fred::types::scripts::Script;
use fred::types::{MultipleKeys, Value};

use crate::error::{Error, Result};

/// One loaded script.
#[derive(Debug)]
pub(crate) struct PoolScript {
    name: &'static str,
    script: Script,
    timeout: std::time::Duration,
}

impl PoolScript {
    fn new(name: &'static str, body: &str, timeout: std::time::Duration) -> Self {
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
            timeout,
        }
    }

    /// Runs the script (EVALSHA, reloading on NOSCRIPT), waiting at most
    /// the node's `redis_timeout` for the answer.
    pub(crate) async fn run<R: FromValue>(
        &self,
        client: &Client,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<R> {
        let keys: MultipleKeys = keys.into();
        bounded(
            self.timeout,
            self.name,
            self.script.evalsha_with_reload(client, keys, args),
        )
        .await
    }
}

/// Waits at most `timeout` for a Redis call; a late answer is an
/// [`Error::Unavailable`] (the call may still take effect).
pub(crate) async fn bounded<T>(
    timeout: std::time::Duration,
    what: &'static str,
    call: impl std::future::Future<Output = std::result::Result<T, fred::error::Error>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result.map_err(|e| {
            tracing::debug!(call = what, error = %e, "redis call failed");
            crate::error::from_redis(e)
        }),
        Err(_) => Err(Error::Unavailable(fred::error::Error::new(
            fred::error::ErrorKind::Timeout,
            format!("no answer from Redis within {timeout:?} ({what})"),
        ))),
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
    pub(crate) begin_recovery: PoolScript,
    pub(crate) release_stale: PoolScript,
    pub(crate) job_ended: PoolScript,
    pub(crate) job_restart: PoolScript,
    pub(crate) job_forget_failed: PoolScript,
}

impl Scripts {
    pub(crate) fn new(timeout: std::time::Duration) -> Self {
        let t = timeout;
        Scripts {
            admit: PoolScript::new("admit", include_str!("scripts/admit.lua"), t),
            claim_start: PoolScript::new("claim_start", include_str!("scripts/claim_start.lua"), t),
            record_starts: PoolScript::new(
                "record_starts",
                include_str!("scripts/record_starts.lua"),
                t,
            ),
            started: PoolScript::new("started", include_str!("scripts/started.lua"), t),
            start_failed: PoolScript::new(
                "start_failed",
                include_str!("scripts/start_failed.lua"),
                t,
            ),
            to_owner: PoolScript::new("to_owner", include_str!("scripts/to_owner.lua"), t),
            stopped: PoolScript::new("stopped", include_str!("scripts/stopped.lua"), t),
            handoff: PoolScript::new("handoff", include_str!("scripts/handoff.lua"), t),
            move_entry: PoolScript::new("move_entry", include_str!("scripts/move_entry.lua"), t),
            register: PoolScript::new("register", include_str!("scripts/register.lua"), t),
            keepalive: PoolScript::new("keepalive", include_str!("scripts/keepalive.lua"), t),
            reassert: PoolScript::new("reassert", include_str!("scripts/reassert.lua"), t),
            resume: PoolScript::new("resume", include_str!("scripts/resume.lua"), t),
            remove_worker: PoolScript::new(
                "remove_worker",
                include_str!("scripts/remove_worker.lua"),
                t,
            ),
            claim_cleanup: PoolScript::new(
                "claim_cleanup",
                include_str!("scripts/claim_cleanup.lua"),
                t,
            ),
            begin_recovery: PoolScript::new(
                "begin_recovery",
                include_str!("scripts/begin_recovery.lua"),
                t,
            ),
            release_stale: PoolScript::new(
                "release_stale",
                include_str!("scripts/release_stale.lua"),
                t,
            ),
            job_ended: PoolScript::new("job_ended", include_str!("scripts/job_ended.lua"), t),
            job_restart: PoolScript::new("job_restart", include_str!("scripts/job_restart.lua"), t),
            job_forget_failed: PoolScript::new(
                "job_forget_failed",
                include_str!("scripts/job_forget_failed.lua"),
                t,
            ),
        }
    }
}

/// Removes the idempotency marker of an admission whose start was refused
/// (`scripts/unmark.lua`; a plain script, no preludes).
pub(crate) static UNMARK: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::from_lua(include_str!("scripts/unmark.lua")));

/// Drops a job from a schedule's job set while the caller leads
/// (`scripts/schedule_forget.lua`; a plain script, no preludes).
pub(crate) static SCHEDULE_FORGET: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::from_lua(include_str!("scripts/schedule_forget.lua")));

/// Decodes a script's `{status, ...}` reply into the status and the rest.
pub(crate) fn status_reply(value: Value) -> Result<(String, Vec<Value>)> {
    let mut items: Vec<Value> = match value {
        Value::Array(items) => items,
        other => vec![other],
    };
    if items.is_empty() {
        return Err(Error::Malformed {
            what: "script reply",
            reason: "empty".into(),
        });
    }
    let rest = items.split_off(1);
    let status = items
        .pop()
        .and_then(|v| v.as_string())
        .ok_or_else(|| Error::Malformed {
            what: "script reply",
            reason: "status is not a string".into(),
        })?;
    Ok((status, rest))
}
