//! Lua prelude for scripts of other crates that write flotilla streams.
//!
//! [`PRELUDE`] defines three local functions; prepend it to a script (after
//! or before other crates' preludes) and call them:
//!
//! ```lua
//! -- returns the new entry id; maxlen > 0 trims with MAXLEN ~; topic may be nil
//! local function stream_add(key, event_name, payload, maxlen, topic)
//! -- as stream_add, but returns false when the stream key does not exist
//! local function stream_add_if_exists(key, event_name, payload, maxlen, topic)
//! -- XDEL of one id, returns 0 or 1
//! local function stream_remove(key, id)
//! ```
//!
//! The stream key must be one of the script's `KEYS` (get it from
//! [`Stream::key`](crate::Stream::key)).

/// The prelude's source. See the [module docs](self).
pub const PRELUDE: &str = include_str!("scripts/prelude.lua");

/// Add with TTL: prelude + `add_ttl.lua`.
pub(crate) fn add_ttl_source() -> String {
    format!("{PRELUDE}\n{}", include_str!("scripts/add_ttl.lua"))
}
