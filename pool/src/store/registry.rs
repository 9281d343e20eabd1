//! The pool's Lua, loaded into Redis as one function library: the rmap and
//! streaming preludes (so one function changes maps and streams atomically
//! while replicas still see every change) and the pool's shared head
//! (`scripts/base.lua`) make up its top level, and every script of
//! `scripts/` becomes one function of it, called with `FCALL`.
//!
//! Why a library and not `EVALSHA`: a script's top level runs at every
//! call, so every call of a script with the preludes made their forty-odd
//! helper functions again: an empty script with them cost 42.1 µs per call
//! against 20.5 µs without them, on the development VM. A library's top
//! level runs once, when Redis loads it; a call runs its function's body
//! only (13.1 µs for that empty call; see the bench README).
//!
//! The library's name and its functions' names carry a digest of its code,
//! so two versions of the pool (a rolling upgrade) never call or replace
//! each other's functions. Redis keeps the library in its snapshots and
//! replicates it; a server that lacks it (an empty restart, a failover to a
//! replica that missed the load, a new cluster node) answers "Function not
//! found", and the call loads it and runs once more.

use std::sync::LazyLock;
use std::time::Duration;

use fred::bytes_utils::Str;
use fred::prelude::*;
use fred::types::{FromValue, MultipleKeys, Value};

use crate::error::Result;

/// `(name, text)` of each named file of `scripts/`.
macro_rules! sources {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("scripts/", $name, ".lua")))),*]
    };
}

/// Every script of `scripts/` but `base.lua`, by name: each becomes the
/// library function `<prefix>_<name>`.
const SOURCES: &[(&str, &str)] = sources![
    "admit",
    "claim_start",
    "record_starts",
    "started",
    "start_failed",
    "to_owner",
    "stopped",
    "handoff",
    "move_entry",
    "drop_entry",
    "register",
    "keepalive",
    "reassert",
    "resume",
    "remove_worker",
    "claim_cleanup",
    "drain_worker",
    "begin_recovery",
    "recovery_mark",
    "release_stale",
    "release_owner",
    "handoff_stands",
    "handoffs_ended",
    "entrust",
    "entrusted_left",
    "stop_stands",
    "job_ended",
    "job_restart",
    "job_forget_failed",
    "job_mark_failed",
    "sweep_orphans",
    "requeue_orphan",
    "sweep_pending",
    "owned_page",
    "unmark",
    "schedule_forget",
    "node_info",
    "server_id",
    "create_epoch",
    "forget_pool",
    "targets_current",
];

/// The pool's function library: its name and code.
#[derive(Debug)]
pub(crate) struct Library {
    /// `flotilla_pool_<digest>`.
    name: String,
    /// The prefix of every function name, `fl<digest>`.
    prefix: String,
    /// The `FUNCTION LOAD` text.
    code: Str,
}

impl Library {
    fn build() -> Library {
        let mut top = String::new();
        for part in [
            flotilla_rmap::lua::PRELUDE,
            flotilla_streaming::lua::PRELUDE,
            include_str!("scripts/base.lua"),
        ] {
            top.push_str(part);
            top.push('\n');
        }
        let mut functions = String::new();
        for (name, body) in SOURCES {
            // The prefix is filled in below, once the digest is known.
            functions.push_str(&format!(
                "redis.register_function('{{prefix}}_{name}', function(keys, args)\n\
                 pool_call_begin(keys, args)\n{body}\nend)\n"
            ));
        }
        let digest = fred::util::sha1_hash(&format!("{top}{functions}"));
        let digest = &digest[..16];
        let prefix = format!("fl{digest}");
        let name = format!("flotilla_pool_{digest}");
        let code = format!(
            "#!lua name={name}\n{top}{}",
            functions.replace("{prefix}", &prefix)
        );
        Library {
            name,
            prefix,
            code: Str::from(code),
        }
    }

    /// Loads the library (on every primary of a cluster).
    ///
    /// Without `REPLACE`, a server that has the library already answers at
    /// once ("already exists", about 12 µs on the development VM) instead
    /// of compiling it again (1.5–2 ms): when many calls find it missing
    /// at once, after an empty restart, Redis compiles it once. On a
    /// cluster, where some primaries may have it and others not, `REPLACE`
    /// loads it on all of them whatever each holds (the same code: the
    /// name carries its digest).
    async fn load(&self, client: &Client) -> std::result::Result<(), fred::error::Error> {
        let replace = client.is_clustered();
        match client
            .function_load_cluster::<Value, _>(replace, self.code.clone())
            .await
        {
            Ok(_) => {
                tracing::info!(library = %self.name, "loaded the pool's function library into Redis");
                Ok(())
            }
            Err(e) if e.details().contains("already exists") => {
                tracing::debug!(library = %self.name, "the pool's function library was loaded meanwhile");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// The library every node of this build loads (the same text, the same
/// digest).
static LIBRARY: LazyLock<Library> = LazyLock::new(Library::build);

/// Whether Redis refused a call because it lacks the function: the server
/// never loaded the library or lost it.
fn function_missing(e: &fred::error::Error) -> bool {
    e.details().contains("Function not found")
}

/// One function of the pool's library.
#[derive(Debug)]
pub(crate) struct PoolScript {
    /// The script's file name, for errors and logs.
    name: &'static str,
    /// The function's name in the library.
    function: Str,
}

impl PoolScript {
    fn new(name: &'static str) -> Self {
        debug_assert!(SOURCES.iter().any(|(n, _)| *n == name), "no script {name}");
        PoolScript {
            name,
            function: Str::from(format!("{}_{name}", LIBRARY.prefix)),
        }
    }

    /// Runs the function (`FCALL`, loading the library when Redis lacks
    /// it), waiting at most `timeout` for the answer.
    pub(crate) async fn run<R: FromValue>(
        &self,
        client: &Client,
        keys: Vec<String>,
        args: Vec<Value>,
        timeout: Duration,
    ) -> Result<R> {
        let keys: MultipleKeys = keys.into();
        let call = async move {
            match client
                .fcall(self.function.clone(), keys.clone(), args.clone())
                .await
            {
                Err(e) if function_missing(&e) => {
                    LIBRARY.load(client).await?;
                    client.fcall(self.function.clone(), keys, args).await
                }
                result => result,
            }
        };
        super::call::bounded(timeout, self.name, call).await
    }
}

/// Every function of the pool.
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
    /// Drops an inbox entry nobody can take, while a cleaner's claim holds.
    pub(crate) drop_entry: PoolScript,
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
    /// Which remembered hand-offs ended since (reads only).
    pub(crate) handoffs_ended: PoolScript,
    /// Leaves a closing worker's memory of a job with a worker that stays.
    pub(crate) entrust: PoolScript,
    /// Which entries `entrust` left are unread yet.
    pub(crate) entrusted_left: PoolScript,
    pub(crate) stop_stands: PoolScript,
    pub(crate) job_ended: PoolScript,
    pub(crate) job_restart: PoolScript,
    pub(crate) job_forget_failed: PoolScript,
    /// Records a failure for good made to stand on a promoted primary.
    pub(crate) job_mark_failed: PoolScript,
    pub(crate) sweep_orphans: PoolScript,
    pub(crate) requeue_orphan: PoolScript,
    pub(crate) sweep_pending: PoolScript,
    pub(crate) owned_page: PoolScript,
    /// Removes the idempotency marker of an admission whose start was
    /// refused.
    pub(crate) unmark: PoolScript,
    /// Drops a job from a schedule's job set while the caller leads.
    pub(crate) schedule_forget: PoolScript,
    /// Records a joining node's info with its join time.
    pub(crate) node_info: PoolScript,
    /// Reads the run id of the server holding the pool's keys, and opens
    /// the recovery window when the pool's scripts last ran on another.
    pub(crate) server_id: PoolScript,
    /// Creates the pool's epoch at a join, or opens the recovery window
    /// when this server held it before.
    pub(crate) create_epoch: PoolScript,
    /// Forgets the pool on this server after its keys were deleted.
    pub(crate) forget_pool: PoolScript,
    /// Which workers a job may be moved to now (read only).
    pub(crate) targets_current: PoolScript,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            admit: PoolScript::new("admit"),
            claim_start: PoolScript::new("claim_start"),
            record_starts: PoolScript::new("record_starts"),
            started: PoolScript::new("started"),
            start_failed: PoolScript::new("start_failed"),
            to_owner: PoolScript::new("to_owner"),
            stopped: PoolScript::new("stopped"),
            handoff: PoolScript::new("handoff"),
            move_entry: PoolScript::new("move_entry"),
            drop_entry: PoolScript::new("drop_entry"),
            register: PoolScript::new("register"),
            keepalive: PoolScript::new("keepalive"),
            reassert: PoolScript::new("reassert"),
            resume: PoolScript::new("resume"),
            remove_worker: PoolScript::new("remove_worker"),
            claim_cleanup: PoolScript::new("claim_cleanup"),
            drain_worker: PoolScript::new("drain_worker"),
            begin_recovery: PoolScript::new("begin_recovery"),
            recovery_mark: PoolScript::new("recovery_mark"),
            release_stale: PoolScript::new("release_stale"),
            release_owner: PoolScript::new("release_owner"),
            handoff_stands: PoolScript::new("handoff_stands"),
            handoffs_ended: PoolScript::new("handoffs_ended"),
            entrust: PoolScript::new("entrust"),
            entrusted_left: PoolScript::new("entrusted_left"),
            stop_stands: PoolScript::new("stop_stands"),
            job_ended: PoolScript::new("job_ended"),
            job_restart: PoolScript::new("job_restart"),
            job_forget_failed: PoolScript::new("job_forget_failed"),
            job_mark_failed: PoolScript::new("job_mark_failed"),
            sweep_orphans: PoolScript::new("sweep_orphans"),
            requeue_orphan: PoolScript::new("requeue_orphan"),
            sweep_pending: PoolScript::new("sweep_pending"),
            owned_page: PoolScript::new("owned_page"),
            unmark: PoolScript::new("unmark"),
            schedule_forget: PoolScript::new("schedule_forget"),
            node_info: PoolScript::new("node_info"),
            server_id: PoolScript::new("server_id"),
            create_epoch: PoolScript::new("create_epoch"),
            forget_pool: PoolScript::new("forget_pool"),
            targets_current: PoolScript::new("targets_current"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_is_one_function_of_the_library() {
        let library = Library::build();
        assert!(library.code.starts_with("#!lua name=flotilla_pool_"));
        for (name, _) in SOURCES {
            let registration = format!("redis.register_function('{}_{name}',", library.prefix);
            assert_eq!(library.code.matches(&registration).count(), 1, "{name}");
        }
        assert!(!library.code.contains("{prefix}"));
    }

    /// `FUNCTION <args>`.
    async fn function_command(client: &Client, args: Vec<&str>) -> Value {
        client
            .custom(
                fred::types::CustomCommand::new_static("FUNCTION", None, false),
                args,
            )
            .await
            .unwrap()
    }

    /// The libraries named `flotilla_pool_*` on the server.
    async fn pool_libraries(client: &Client) -> Vec<String> {
        let list = function_command(client, vec!["LIST", "LIBRARYNAME", "flotilla_pool_*"]).await;
        let Value::Array(libraries) = list else {
            panic!("FUNCTION LIST answered {list:?}")
        };
        libraries
            .into_iter()
            .map(|library| {
                let fields: Vec<Value> = library.convert().unwrap();
                let at = fields
                    .iter()
                    .position(|f| f.as_str().as_deref() == Some("library_name"))
                    .unwrap();
                fields[at + 1].as_string().unwrap()
            })
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_that_lost_the_library_is_given_it_again_by_the_next_call() {
        let server = flotilla_testkit::RedisServer::start().unwrap();
        let client = flotilla_testkit::client(&server.url()).await.unwrap();
        let unmark = PoolScript::new("unmark");
        let call = || {
            // KEYS[1] a marker, ARGV[1] a token; 0 when there is no marker.
            unmark.run::<u64>(
                &client,
                vec!["fl:{t}:marker".to_string()],
                vec![Value::from("1")],
                Duration::from_secs(5),
            )
        };
        assert!(pool_libraries(&client).await.is_empty());
        assert_eq!(call().await.unwrap(), 0, "first call loads");
        assert_eq!(pool_libraries(&client).await, [LIBRARY.name.as_str()]);
        // As after an empty restart: the server has no functions at all.
        function_command(&client, vec!["FLUSH"]).await;
        assert!(pool_libraries(&client).await.is_empty());
        assert_eq!(call().await.unwrap(), 0, "the call after the loss");
        assert_eq!(pool_libraries(&client).await, [LIBRARY.name.as_str()]);
        // Many calls find it missing at once: those whose load comes
        // second find the library there ("already exists") and run.
        function_command(&client, vec!["FLUSH"]).await;
        let burst = futures::future::join_all((0..20).map(|_| call())).await;
        assert!(burst.iter().all(|r| matches!(r, Ok(0))), "{burst:?}");
        assert_eq!(pool_libraries(&client).await, [LIBRARY.name.as_str()]);
        // A load where the library is already there succeeds.
        LIBRARY.load(&client).await.unwrap();
    }
}
