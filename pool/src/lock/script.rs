//! The Lua scripts of locks (`scripts/*.lua`), run through the crate's one
//! timed call runner.

use std::sync::LazyLock;

use fred::types::scripts::Script;

/// Takes a free lock (`scripts/acquire.lua`).
pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(include_str!("scripts/acquire.lua")));
/// Extends a lock held by the caller (`scripts/refresh.lua`).
pub(crate) static REFRESH: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(include_str!("scripts/refresh.lua")));
/// Deletes a lock held by the caller (`scripts/release.lua`).
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(include_str!("scripts/release.lua")));
/// Reads a lock's holder record (`scripts/info.lua`).
pub(crate) static INFO: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(include_str!("scripts/info.lua")));
