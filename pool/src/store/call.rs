//! The one way the crate talks to Redis with a deadline: every script call
//! of the locks and the tickers goes through [`script`], every function
//! call of the pool (`registry.rs`) and every other bounded call through
//! [`bounded`]; errors are classified by
//! [`from_redis`]. Server time and the readers of script replies live here
//! too.

use std::time::Duration;

use fred::error::{Error as RedisError, ErrorKind};
use fred::prelude::*;
use fred::types::scripts::Script;
use fred::types::{FromValue, MultipleKeys, MultipleValues, Value};

pub(crate) use crate::error::from_redis;
use crate::error::{Error, Result};

/// Waits at most `timeout` for a Redis call; a late answer is an
/// [`Error::Unavailable`] (the call may still take effect).
///
/// The call is boxed before the returned future is made: fred's command
/// futures are kilobytes, and held inline (an async fn keeps its arguments
/// in its state) they would make every future that awaits a Redis call — a
/// worker's start, a dispatch — as large, and copied whole each time one
/// is made.
pub(crate) fn bounded<T>(
    timeout: Duration,
    what: &'static str,
    call: impl std::future::Future<Output = std::result::Result<T, RedisError>>,
) -> impl std::future::Future<Output = Result<T>> {
    let call = Box::pin(call);
    async move {
        match tokio::time::timeout(timeout, call).await {
            Ok(result) => result.map_err(|e| {
                tracing::debug!(call = what, error = %e, "redis call failed");
                from_redis(e)
            }),
            Err(_) => Err(late(timeout, what)),
        }
    }
}

/// Like [`bounded`], for a call of another crate (streams, maps) whose
/// errors convert into the pool's.
pub(crate) fn within<T, E: Into<Error>>(
    timeout: Duration,
    what: &'static str,
    call: impl std::future::Future<Output = std::result::Result<T, E>>,
) -> impl std::future::Future<Output = Result<T>> {
    let call = Box::pin(call);
    async move {
        match tokio::time::timeout(timeout, call).await {
            Ok(result) => result.map_err(Into::into),
            Err(_) => Err(late(timeout, what)),
        }
    }
}

/// One status per item of a batched call (`what` names the reply), each
/// read by `parse`: as many as the call carried, or the reply is
/// malformed.
pub(crate) fn statuses<T>(
    what: &'static str,
    count: usize,
    values: &[Value],
    parse: impl Fn(&str) -> Result<T>,
) -> Result<Vec<T>> {
    if values.len() != count {
        return Err(Error::Malformed {
            what,
            reason: format!("{} statuses for {count} items", values.len()),
        });
    }
    values
        .iter()
        .map(|v| match v.as_str() {
            Some(word) => parse(&word),
            None => Err(Error::Malformed {
                what,
                reason: format!("not a status: {v:?}"),
            }),
        })
        .collect()
}

/// The error of a call Redis did not answer within `timeout`.
pub(crate) fn late(timeout: Duration, what: &'static str) -> Error {
    Error::Unavailable(RedisError::new(
        ErrorKind::Timeout,
        format!("no answer from Redis within {timeout:?} ({what})"),
    ))
}

/// Runs `script` with EVALSHA (reloading on NOSCRIPT), bounded by `timeout`.
///
/// # Errors
/// [`Error::Unavailable`] when Redis does not answer within `timeout` or the
/// connection failed; [`Error::Redis`] when Redis answered with an error.
pub(crate) async fn script<R, K, V>(
    client: &Client,
    script: &Script,
    what: &'static str,
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
    bounded(
        timeout,
        what,
        script.evalsha_with_reload(client, keys, args),
    )
    .await
}

/// Redis server time in ms (`TIME`).
pub(crate) async fn server_time_ms(client: &Client) -> Result<u64> {
    let (secs, micros): (String, String) = client
        .custom(
            fred::types::CustomCommand::new_static(
                "TIME",
                fred::types::ClusterHash::FirstKey,
                false,
            ),
            Vec::<String>::new(),
        )
        .await
        .map_err(from_redis)?;
    let parse = |s: &str| {
        s.parse::<u64>().map_err(|_| Error::Malformed {
            what: "TIME reply",
            reason: format!("not a number: {s:?}"),
        })
    };
    Ok(parse(&secs)? * 1000 + parse(&micros)? / 1000)
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

/// Decodes a script's `{status, ...}` reply into the status and the rest.
pub(crate) fn status_reply(what: &'static str, value: Value) -> Result<(String, Vec<Value>)> {
    let mut items: Vec<Value> = match value {
        Value::Array(items) => items,
        other => vec![other],
    };
    if items.is_empty() {
        return Err(Error::Malformed {
            what,
            reason: "empty".into(),
        });
    }
    let rest = items.split_off(1);
    let status = items
        .pop()
        .and_then(|v| v.as_string())
        .ok_or_else(|| Error::Malformed {
            what,
            reason: "status is not a string".into(),
        })?;
    Ok((status, rest))
}

/// The older dispatch's admission stamp in a script's
/// `superseded <stamp>` status (`supersede_older` in `base.lua`).
pub(crate) fn superseded(status: &str) -> Option<u64> {
    status.strip_prefix("superseded ")?.parse().ok()
}

/// The error of a status a script does not return.
pub(crate) fn unknown_status(what: &'static str, status: &str) -> Error {
    Error::Malformed {
        what,
        reason: format!("unknown status {status:?}"),
    }
}

/// A script's status strings as an enum: `as_str` gives the script's word,
/// `parse` reads it (an unknown word is [`Error::Malformed`]).
macro_rules! status {
    ($(#[$meta:meta])* $name:ident, $what:literal { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// The script's word for this status.
            #[allow(dead_code)]
            pub(crate) fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text),+
                }
            }

            /// Reads the script's word.
            #[allow(dead_code)]
            pub(crate) fn parse(status: &str) -> $crate::error::Result<Self> {
                match status {
                    $($text => Ok(Self::$variant),)+
                    other => Err($crate::store::call::unknown_status($what, other)),
                }
            }
        }

        /// Compares with the script's word.
        impl PartialEq<&str> for $name {
            fn eq(&self, word: &&str) -> bool {
                self.as_str() == *word
            }
        }
    };
}
pub(crate) use status;
