//! The Lua scripts of locks and tickers, and a bounded way to run them.

use std::sync::LazyLock;
use std::time::Duration;

use fred::error::{Error as RedisError, ErrorKind};
use fred::prelude::Client;
use fred::types::scripts::Script;
use fred::types::{FromValue, MultipleKeys, MultipleValues, Value};

use crate::error::{Error, Result};

/// Takes a free lock (`lock_acquire.lua`).
pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(include_str!("../scripts/lock_acquire.lua")));
/// Extends a lock held by the caller (`lock_refresh.lua`).
pub(crate) static REFRESH: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(include_str!("../scripts/lock_refresh.lua")));
/// Deletes a lock held by the caller (`lock_release.lua`).
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(include_str!("../scripts/lock_release.lua")));
/// Reads a lock's holder record (`lock_info.lua`).
pub(crate) static INFO: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(include_str!("../scripts/lock_info.lua")));
/// Claims a ticker slot (`ticker_advance.lua`).
pub(crate) static TICKER_ADVANCE: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(include_str!("../scripts/ticker_advance.lua")));

/// Runs `script` with EVALSHA (reloading on NOSCRIPT), bounded by `timeout`.
///
/// # Errors
/// [`Error::Unavailable`] when Redis does not answer within `timeout` or the
/// connection failed; [`Error::Redis`] when Redis answered with an error.
pub(crate) async fn call<R, K, V>(
    client: &Client,
    script: &Script,
    keys: K,
    args: V,
    timeout: Duration,
) -> Result<R>
where
    R: FromValue,
    K: Into<MultipleKeys> + Send,
    V: TryInto<MultipleValues> + Send,
    V::Error: Into<RedisError> + Send,
{
    match tokio::time::timeout(timeout, script.evalsha_with_reload(client, keys, args)).await {
        Ok(result) => result.map_err(crate::error::from_redis),
        Err(_) => Err(Error::Unavailable(RedisError::new(
            ErrorKind::Timeout,
            format!("no answer from redis within {timeout:?}"),
        ))),
    }
}

/// Reads an unsigned integer out of a script's reply.
pub(crate) fn u64_at(values: &[Value], index: usize, what: &'static str) -> Result<u64> {
    values
        .get(index)
        .and_then(Value::as_u64)
        .ok_or_else(|| Error::Malformed {
            what,
            reason: format!("expected an unsigned integer at position {index}, got {values:?}"),
        })
}

/// Reads a string out of a script's reply (missing → empty).
pub(crate) fn string_at(values: &[Value], index: usize) -> String {
    values
        .get(index)
        .and_then(Value::as_string)
        .unwrap_or_default()
}
