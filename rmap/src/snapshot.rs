//! Reading a map's content for a replica: the revision, the sync marker and
//! a first page in one script, then the rest in `HSCAN` pages.
//!
//! A map that fits in one page is read atomically, as one script. A larger
//! one is read page by page, so Redis is never held for the whole map (a
//! million fields in one `HGETALL` reply kept Redis busy for about two
//! seconds, most of it turning the reply into a Lua table and back) and the
//! client decodes small replies. Writes go on between pages, so a page can
//! hold values newer than the revision the first page read. That is sound
//! because the marker was published with the first page: every change after
//! it comes on the channel afterwards, and the replica applies those changes
//! in revision order on top of the pages. A key's last change then decides
//! its value whatever the pages held, and a key no change touched holds
//! what it held at the first page (`HSCAN` returns every field present from
//! the start to the end of the scan). The channel's messages are taken off
//! its buffer while pages are read, so a busy map does not overflow it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand, Message as FredMessage};
use tokio::sync::broadcast;
use tokio_util::task::AbortOnDropHandle;

use crate::error::Error;
use crate::keys::MapKeys;
use crate::lua::SCRIPTS;

/// Times a read starts again from its first page after the channel's
/// buffer overflowed during it, before the read fails.
const LAGGED_RETRIES: usize = 3;

/// A snapshot of the map in Redis.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// The revision read with the first page.
    pub(crate) rev: u64,
    pub(crate) data: imbl::HashMap<Arc<str>, Arc<str>>,
    /// The token of the marker published with the first page.
    pub(crate) token: String,
}

/// How a snapshot is read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SnapshotLimits {
    /// Deadline of each call (in place of the client's command timeout).
    pub(crate) timeout: Duration,
    /// Fields per page (`HSCAN`'s `COUNT`).
    pub(crate) page: usize,
}

/// The channel of the map whose snapshot is read: its messages are moved
/// to `backlog` while pages are read.
#[derive(Debug)]
pub(crate) struct Channel<'a> {
    pub(crate) messages: &'a mut broadcast::Receiver<FredMessage>,
    pub(crate) backlog: &'a mut VecDeque<FredMessage>,
}

/// A token naming one snapshot's marker, unique across processes.
pub(crate) fn new_token() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        nanos
    )
}

/// Reads the map: revision, marker and content. Messages that arrive on
/// `channel` meanwhile are appended to its backlog (which starts empty:
/// whatever it held predates the read).
pub(crate) async fn load_snapshot(
    client: &Client,
    keys: &MapKeys,
    limits: SnapshotLimits,
    channel: Channel<'_>,
) -> Result<Snapshot, Error> {
    let Channel { messages, backlog } = channel;
    let mut attempt = 0;
    loop {
        backlog.clear();
        // Boxed: the read's state is large, and it would otherwise be part
        // of every future that joins a map.
        match Box::pin(read_pages(client, keys, limits, messages, backlog)).await {
            Err(ReadError::Lagged) if attempt < LAGGED_RETRIES => {
                attempt += 1;
                tracing::debug!(map = %keys.hash, attempt, "channel overflowed during a paged snapshot: reading again");
            }
            Err(ReadError::Lagged) => {
                return Err(Error::malformed(
                    "snapshot",
                    "the map's channel overflowed during every attempt (raise message_buffer)",
                ));
            }
            Err(ReadError::Map(e)) => return Err(e),
            Ok(snapshot) => return Ok(snapshot),
        }
    }
}

enum ReadError {
    Lagged,
    Map(Error),
}

impl<E: Into<Error>> From<E> for ReadError {
    fn from(e: E) -> Self {
        ReadError::Map(e.into())
    }
}

async fn read_pages(
    client: &Client,
    keys: &MapKeys,
    limits: SnapshotLimits,
    messages: &mut broadcast::Receiver<FredMessage>,
    backlog: &mut VecDeque<FredMessage>,
) -> Result<Snapshot, ReadError> {
    // The client's command timeout is for single commands; a page of a
    // large map, or a Redis busy with other clients, can take longer.
    let with_deadline = client.with_options(&fred::types::config::Options {
        timeout: Some(limits.timeout),
        ..Default::default()
    });
    let token = new_token();
    let page = limits.page.max(1).to_string();
    let first = first_page(client, &with_deadline, keys, &token, &page).await?;
    let Value::Array(mut parts) = first else {
        return Err(Error::malformed("snapshot reply", format!("{first:?}")).into());
    };
    let (Some(fields), Some(cursor), Some(rev), None) =
        (parts.pop(), parts.pop(), parts.pop(), parts.pop())
    else {
        return Err(Error::malformed("snapshot reply", "expected 3 elements").into());
    };
    let rev = rev
        .as_string()
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| Error::malformed("snapshot revision", format!("{rev:?}")))?;
    let mut data = imbl::HashMap::new();
    let cursor = cursor_of(cursor)?;
    // The next page is asked for before this one is decoded, so Redis
    // scans it while the client decodes and stores the last: the read then
    // takes about as long as the slower of the two, not their sum.
    let mut next = (cursor != "0").then(|| request_page(&with_deadline, keys, &cursor, &page));
    insert_fields(keys, &mut data, fields)?;
    while let Some(mut request) = next.take() {
        let reply = loop {
            tokio::select! {
                reply = &mut request => break reply.map_err(page_task_ended)??,
                message = messages.recv() => match message {
                    Ok(m) => backlog.push_back(m),
                    Err(broadcast::error::RecvError::Lagged(_)) => return Err(ReadError::Lagged),
                    Err(broadcast::error::RecvError::Closed) => return Err(Error::SubscriptionsClosed.into()),
                },
            }
        };
        let Value::Array(mut parts) = reply else {
            return Err(Error::malformed("snapshot page", format!("{reply:?}")).into());
        };
        let (Some(fields), Some(next_cursor), None) = (parts.pop(), parts.pop(), parts.pop())
        else {
            return Err(Error::malformed("snapshot page", "expected 2 elements").into());
        };
        let cursor = cursor_of(next_cursor)?;
        next = (cursor != "0").then(|| request_page(&with_deadline, keys, &cursor, &page));
        // A field can come twice (the hash grew or shrank between pages):
        // the later page read it later, so its value wins.
        insert_fields(keys, &mut data, fields)?;
    }
    Ok(Snapshot { rev, data, token })
}

/// Sends the `HSCAN` for the page at `cursor` now (in its own task, so it
/// goes out before the caller awaits it); dropping the handle abandons it.
fn request_page(
    with_deadline: &fred::clients::WithOptions<Client>,
    keys: &MapKeys,
    cursor: &str,
    page: &str,
) -> AbortOnDropHandle<Result<Value, fred::error::Error>> {
    let args: Vec<Value> = vec![
        keys.hash.as_str().into(),
        cursor.into(),
        "COUNT".into(),
        page.into(),
    ];
    let client = with_deadline.clone();
    AbortOnDropHandle::new(tokio::spawn(async move {
        client
            .custom::<Value, Value>(
                CustomCommand::new_static("HSCAN", ClusterHash::FirstKey, false),
                args,
            )
            .await
    }))
}

/// A page's task that ended without an answer (the runtime is shutting
/// down, or the task panicked) fails the read as a canceled command.
fn page_task_ended(e: tokio::task::JoinError) -> Error {
    Error::Redis(fred::error::Error::new(
        fred::error::ErrorKind::Canceled,
        format!("snapshot page: {e}"),
    ))
}

/// The first page: revision, first page and marker, in one script
/// (`EVALSHA` by hand: fred's script helpers take no per-call options).
/// Routed by the first key (argument 2) on Cluster.
async fn first_page(
    client: &Client,
    with_deadline: &fred::clients::WithOptions<Client>,
    keys: &MapKeys,
    token: &str,
    page: &str,
) -> Result<Value, Error> {
    let script = &SCRIPTS.snapshot;
    let args: Vec<Value> = vec![
        Value::from(script.sha1().clone()),
        Value::from(3),
        Value::from(keys.hash.as_str()),
        Value::from(keys.revision.as_str()),
        Value::from(keys.channel.as_str()),
        Value::from(token),
        Value::from(page),
    ];
    let evalsha = || {
        with_deadline.custom::<Value, Value>(
            CustomCommand::new_static("EVALSHA", ClusterHash::Offset(2), false),
            args.clone(),
        )
    };
    Ok(match evalsha().await {
        Err(e) if e.details().starts_with("NOSCRIPT") => {
            script.load(client).await?;
            evalsha().await?
        }
        result => result?,
    })
}

fn cursor_of(cursor: Value) -> Result<String, Error> {
    cursor
        .as_string()
        .ok_or_else(|| Error::malformed("snapshot cursor", format!("{cursor:?}")))
}

/// Adds a page's `[field, value, …]` to `data`.
fn insert_fields(
    keys: &MapKeys,
    data: &mut imbl::HashMap<Arc<str>, Arc<str>>,
    fields: Value,
) -> Result<(), Error> {
    let fields = match fields {
        Value::Array(fields) => fields,
        Value::Null => Vec::new(),
        other => return Err(Error::malformed("snapshot content", format!("{other:?}"))),
    };
    let mut fields = fields.into_iter();
    while let (Some(k), Some(v)) = (fields.next(), fields.next()) {
        match (k.as_str(), v.as_str()) {
            (Some(k), Some(v)) => {
                data.insert(Arc::from(&*k), Arc::from(&*v));
            }
            _ => tracing::warn!(map = %keys.hash, "skipping a field that is not UTF-8"),
        }
    }
    Ok(())
}
