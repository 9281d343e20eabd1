//! [`Stream`]: a named Redis stream of events.

use std::fmt;
use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use fred::prelude::*;
use fred::types::Value;
use fred::types::scripts::Script;

use crate::event::{FIELD_NAME, FIELD_PAYLOAD, FIELD_TOPIC};
use crate::options::{AddOptions, StreamOptions, StreamTtl};
use crate::{Error, keys};

static ADD_TTL: LazyLock<Script> = LazyLock::new(|| Script::from_lua(crate::lua::add_ttl_source()));

/// A named stream of events on one Redis stream key.
///
/// Cheap to clone; creating one does no I/O.
///
/// # Examples
/// ```no_run
/// # async fn demo(client: fred::prelude::Client) -> Result<(), flotilla_streaming::Error> {
/// use flotilla_streaming::{AddOptions, Stream, StreamOptions};
/// let stream = Stream::new(&client, "orders", StreamOptions::default().max_len(10_000))?;
/// let id = stream.add("created", &b"\x01\x02"[..]).await?;
/// stream.add_with("paid", "42", AddOptions::default().topic("eu")).await?;
/// # let _ = id; Ok(()) }
/// ```
#[derive(Clone)]
pub struct Stream {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    name: String,
    key: String,
    tag: String,
    options: StreamOptions,
}

impl Stream {
    /// A handle on the stream `name`. No I/O: the Redis key is created by the
    /// first add.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a bad name or hash tag,
    /// [`Error::InvalidOption`] for a zero TTL.
    pub fn new(client: &Client, name: &str, options: StreamOptions) -> Result<Stream, Error> {
        crate::error::check_name(name)?;
        options.validate()?;
        let tag = keys::stream_tag(name, options.hash_tag.as_deref()).to_string();
        let key = keys::stream_key(name, options.hash_tag.as_deref());
        Ok(Stream {
            inner: Arc::new(Inner {
                client: client.clone(),
                name: name.to_string(),
                key,
                tag,
                options,
            }),
        })
    }

    /// The stream's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The stream's Redis key (for `KEYS` of scripts using [`crate::lua::PRELUDE`]).
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// The hash tag of the stream's key (without braces).
    pub fn hash_tag(&self) -> &str {
        &self.inner.tag
    }

    /// Appends an event; returns its id.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn add(&self, event_name: &str, payload: impl Into<Bytes>) -> Result<String, Error> {
        match self
            .add_with(event_name, payload, AddOptions::default())
            .await?
        {
            Some(id) => Ok(id),
            None => Err(Error::Malformed {
                id: String::new(),
                reason: "XADD returned no id",
            }),
        }
    }

    /// Appends an event with options; returns its id, or `None` when
    /// `only_if_exists` is set and the stream does not exist.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn add_with(
        &self,
        event_name: &str,
        payload: impl Into<Bytes>,
        opts: AddOptions,
    ) -> Result<Option<String>, Error> {
        let payload: Bytes = payload.into();
        let max_len = opts.max_len.or(self.inner.options.max_len).unwrap_or(0);
        if let Some(ttl) = self.inner.options.ttl {
            let (ms, mode) = match ttl {
                StreamTtl::Absolute(d) => (d.as_millis() as u64, "a"),
                StreamTtl::Sliding(d) => (d.as_millis() as u64, "s"),
            };
            let args: Vec<Value> = vec![
                event_name.into(),
                Value::Bytes(payload),
                max_len.to_string().into(),
                if opts.topic.is_some() { "1" } else { "0" }.into(),
                opts.topic.unwrap_or_default().into(),
                if opts.only_if_exists { "1" } else { "0" }.into(),
                ms.to_string().into(),
                mode.into(),
            ];
            let id: Value = ADD_TTL
                .evalsha_with_reload(&self.inner.client, vec![self.inner.key.clone()], args)
                .await?;
            return Ok(id.as_string());
        }
        let mut fields: Vec<(&str, Value)> = Vec::with_capacity(3);
        fields.push((FIELD_NAME, event_name.into()));
        if let Some(topic) = &opts.topic {
            fields.push((FIELD_TOPIC, topic.as_str().into()));
        }
        fields.push((FIELD_PAYLOAD, Value::Bytes(payload)));
        let id: Value = if max_len > 0 {
            self.inner
                .client
                .xadd(
                    self.inner.key.as_str(),
                    opts.only_if_exists,
                    ("MAXLEN", "~", max_len as i64),
                    "*",
                    fields,
                )
                .await?
        } else {
            self.inner
                .client
                .xadd(
                    self.inner.key.as_str(),
                    opts.only_if_exists,
                    None,
                    "*",
                    fields,
                )
                .await?
        };
        Ok(id.as_string())
    }

    /// Deletes entries by id; returns how many existed.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn remove(&self, ids: &[&str]) -> Result<u64, Error> {
        if ids.is_empty() {
            return Ok(0);
        }
        let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        Ok(self.inner.client.xdel(self.inner.key.as_str(), ids).await?)
    }

    /// The number of entries in the stream (0 when it does not exist).
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn len(&self) -> Result<u64, Error> {
        Ok(self.inner.client.xlen(self.inner.key.as_str()).await?)
    }

    /// Whether the stream has no entries (or does not exist).
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len().await? == 0)
    }

    /// Deletes the stream key with all its entries and consumer groups.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn destroy(&self) -> Result<(), Error> {
        let _: i64 = self.inner.client.del(self.inner.key.as_str()).await?;
        Ok(())
    }

    /// The id of the stream's newest entry, `0-0` when empty or absent.
    pub(crate) async fn last_id(&self, client: &Client) -> Result<String, Error> {
        let v: Value = client
            .xrevrange(self.inner.key.as_str(), "+", "-", Some(1))
            .await?;
        let last = crate::event::parse_entries(v)
            .into_iter()
            .next()
            .map(|(id, _)| id);
        Ok(last.unwrap_or_else(|| "0-0".to_string()))
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("name", &self.inner.name)
            .field("key", &self.inner.key)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}
