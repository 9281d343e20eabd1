//! The Lua prelude other crates prepend to scripts that change a map, and
//! this crate's own scripts.
//!
//! Every replicated write must change the hash, bump the revision and
//! publish the change in one script, in rmap's wire format. Only this module
//! knows that format: a script of another crate (say, the pool's admission
//! script, which changes several maps and a stream at once) prepends
//! [`PRELUDE`] and calls its functions with a map's [`MapKeys`](crate::MapKeys):
//!
//! | function | effect | returns |
//! |---|---|---|
//! | `rmap_set(hash_key, rev_key, channel, field, value)` | sets the field, bumps the revision, publishes | the new revision |
//! | `rmap_del(hash_key, rev_key, channel, field)` | deletes the field if present (bumps and publishes only then) | `1` if deleted, else `0` |
//! | `rmap_reset(hash_key, rev_key, channel)` | deletes every field, bumps, publishes | the new revision |
//! | `rmap_ttl(hash_key, rev_key, mode, ms)` | applies a TTL option (`''`, `'a'` absolute, `'s'` sliding) | nothing |
//! | `rmap_batch(hash_key, rev_key, channel)` | starts a batch of changes to one map | the batch (a table) |
//! | `rmap_batch_set(batch, field, value)` / `rmap_batch_del(batch, field)` | changes the field now, announces it at the flush | nothing / `1` if deleted, else `0` |
//! | `rmap_batch_set_nx(batch, field, value)` | sets the field now only if it does not exist, announces it at the flush | `1` if set, else `0` |
//! | `rmap_batch_flush(batch)` | bumps the revision once and publishes every change of the batch in one message | the new revision, or `false` if nothing changed |
//! | `rmap_publish(rev_key, channel, op, field, value)` | low level: bump + publish only | the new revision |
//! | `rmap_decode_list(value)` | decodes a list value (JSON array of strings) | the table, or `nil, reason` |
//! | `rmap_begin()` | resets the prelude's per-run state; first in every function of a Redis function library that holds the prelude (its top level runs once, at load) | nothing |
//!
//! Pass the map's three names in `KEYS` (so Redis Cluster routes the script to
//! their slot) and read them from there. Values must be strings.
//!
//! # Examples
//! ```no_run
//! # async fn demo(client: &fred::prelude::Client, map: &flotilla_rmap::Map) -> Result<(), fred::error::Error> {
//! use fred::types::scripts::Script;
//! let script = Script::from_lua(flotilla_rmap::lua::with_prelude(
//!     "return rmap_set(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2])",
//! ));
//! let k = map.keys_info();
//! let revision: u64 = script
//!     .evalsha_with_reload(client, vec![k.hash.clone(), k.revision.clone(), k.channel.clone()], vec!["key", "value"])
//!     .await?;
//! # let _ = revision; Ok(()) }
//! ```

use std::sync::LazyLock;

use fred::types::scripts::Script;

/// Lua functions for replicated writes; see the [module docs](self).
pub const PRELUDE: &str = include_str!("scripts/prelude.lua");

/// `script` with [`PRELUDE`] in front of it.
pub fn with_prelude(script: &str) -> String {
    let mut out = String::with_capacity(PRELUDE.len() + script.len() + 1);
    out.push_str(PRELUDE);
    out.push('\n');
    out.push_str(script);
    out
}

/// This crate's scripts, each [`PRELUDE`] plus one file of `scripts/`.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) snapshot: Script,
    pub(crate) set: Script,
    pub(crate) set_nx: Script,
    pub(crate) test_and_set: Script,
    pub(crate) test_and_delete: Script,
    pub(crate) delete: Script,
    pub(crate) inc: Script,
    pub(crate) append: Script,
    pub(crate) remove: Script,
    pub(crate) reset: Script,
    pub(crate) destroy: Script,
}

fn load(body: &str) -> Script {
    Script::from_lua(with_prelude(body))
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    snapshot: load(include_str!("scripts/snapshot.lua")),
    set: load(include_str!("scripts/set.lua")),
    set_nx: load(include_str!("scripts/set_nx.lua")),
    test_and_set: load(include_str!("scripts/test_and_set.lua")),
    test_and_delete: load(include_str!("scripts/test_and_delete.lua")),
    delete: load(include_str!("scripts/delete.lua")),
    inc: load(include_str!("scripts/inc.lua")),
    append: load(include_str!("scripts/append.lua")),
    remove: load(include_str!("scripts/remove.lua")),
    reset: load(include_str!("scripts/reset.lua")),
    destroy: load(include_str!("scripts/destroy.lua")),
});
