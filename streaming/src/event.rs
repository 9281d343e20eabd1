//! Events and the stream entry format (codec).
//!
//! An entry has the fields `n` (event name, UTF-8), `p` (payload, opaque
//! bytes) and optionally `t` (topic, UTF-8). Other fields are ignored, so
//! later versions may add some; an entry without `n` or `p` is malformed.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use fred::prelude::Server;
use fred::types::Value;

use crate::Error;

/// Field holding the event name.
pub(crate) const FIELD_NAME: &str = "n";
/// Field holding the topic (optional).
pub(crate) const FIELD_TOPIC: &str = "t";
/// Field holding the payload.
pub(crate) const FIELD_PAYLOAD: &str = "p";

/// One event read from a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The Redis stream entry id (`<ms>-<seq>`).
    pub id: String,
    /// The name of the stream it was read from (not the Redis key).
    pub stream: String,
    /// The event name given to `add`.
    pub name: String,
    /// The topic given to `add_with`, if any.
    pub topic: Option<String>,
    /// The payload, byte-exact.
    pub payload: Bytes,
    /// The server whose `XREAD` reply carried the event, as the reader's
    /// connection knew it when the reply came (`None`: not known, or not
    /// read by a [`crate::Reader`]). Behind Sentinel a reader's connection
    /// can stay on a primary that was failed over, and woke, while the
    /// caller's commands go to the promoted one: events read there are
    /// another server's, and the caller can tell by this.
    pub server: Option<Server>,
}

impl Event {
    /// When the event was added, from the millisecond part of its id
    /// (Redis server clock). `UNIX_EPOCH` if the id does not parse.
    pub fn created_at(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(id_millis(&self.id).unwrap_or(0))
    }
}

/// The millisecond part of a stream id.
pub(crate) fn id_millis(id: &str) -> Option<u64> {
    id.split('-').next()?.parse().ok()
}

/// One raw entry: its id and its fields, or `None` when Redis returned nil
/// fields (entry deleted after it was delivered).
pub(crate) type RawEntry = (String, Option<Value>);

/// Decodes an entry's fields into an event.
pub(crate) fn decode(stream: &str, id: String, fields: Value) -> Result<Event, Error> {
    let malformed = |id: &String, reason| Error::Malformed {
        id: id.clone(),
        reason,
    };
    let mut name = None;
    let mut topic = None;
    let mut payload = None;
    let mut put = |field: &[u8], value: Value| -> Result<(), &'static str> {
        let slot = match field {
            b"n" => &mut name,
            b"t" => &mut topic,
            b"p" => &mut payload,
            _ => return Ok(()),
        };
        let bytes = match value {
            Value::Bytes(b) => b,
            Value::String(s) => s.into_inner(),
            Value::Integer(i) => Bytes::from(i.to_string()),
            _ => return Err("a field value is not a string"),
        };
        *slot = Some(bytes);
        Ok(())
    };
    match fields {
        Value::Array(values) => {
            if values.len() % 2 != 0 {
                return Err(malformed(&id, "odd number of field values"));
            }
            let mut it = values.into_iter();
            while let (Some(f), Some(v)) = (it.next(), it.next()) {
                let Some(f) = f.as_bytes().map(<[u8]>::to_vec) else {
                    return Err(malformed(&id, "a field name is not a string"));
                };
                put(&f, v).map_err(|r| malformed(&id, r))?;
            }
        }
        Value::Map(map) => {
            for (k, v) in map.inner() {
                put(k.as_bytes(), v).map_err(|r| malformed(&id, r))?;
            }
        }
        _ => return Err(malformed(&id, "fields are not an array")),
    }
    let name = name.ok_or_else(|| malformed(&id, "missing event name field `n`"))?;
    let name =
        String::from_utf8(name.to_vec()).map_err(|_| malformed(&id, "event name is not UTF-8"))?;
    let topic = match topic {
        Some(t) => {
            Some(String::from_utf8(t.to_vec()).map_err(|_| malformed(&id, "topic is not UTF-8"))?)
        }
        None => None,
    };
    let payload = payload.ok_or_else(|| malformed(&id, "missing payload field `p`"))?;
    Ok(Event {
        id,
        stream: stream.to_string(),
        name,
        topic,
        payload,
        server: None,
    })
}

/// Parses a list of entries `[[id, fields|nil], ...]`.
pub(crate) fn parse_entries(value: Value) -> Vec<RawEntry> {
    let mut out = Vec::new();
    let Value::Array(entries) = value else {
        return out;
    };
    out.reserve(entries.len());
    for entry in entries {
        let Value::Array(mut pair) = entry else {
            tracing::warn!("stream entry is not an [id, fields] pair; skipped");
            continue;
        };
        if pair.is_empty() {
            continue;
        }
        let fields = if pair.len() >= 2 {
            pair.swap_remove(1)
        } else {
            Value::Null
        };
        let Some(id) = pair.swap_remove(0).as_string() else {
            tracing::warn!("stream entry without a string id; skipped");
            continue;
        };
        out.push((id, (!fields.is_null()).then_some(fields)));
    }
    out
}

/// Parses an `XREAD`/`XREADGROUP` reply (RESP2 array or RESP3 map) into
/// `(key, entries)` pairs. Nil gives an empty list.
pub(crate) fn parse_xread(value: Value) -> Vec<(String, Vec<RawEntry>)> {
    let mut out = Vec::new();
    match value {
        Value::Array(streams) => {
            for stream in streams {
                let Value::Array(mut pair) = stream else {
                    continue;
                };
                if pair.len() != 2 {
                    continue;
                }
                let entries = pair.swap_remove(1);
                if let Some(key) = pair.swap_remove(0).as_string() {
                    out.push((key, parse_entries(entries)));
                }
            }
        }
        Value::Map(map) => {
            for (key, entries) in map.inner() {
                if let Some(key) = key.as_str() {
                    out.push((key.to_string(), parse_entries(entries)));
                }
            }
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Value {
        Value::String(v.into())
    }

    #[test]
    fn decodes_and_refuses() {
        let fields = Value::Array(vec![
            s("n"),
            s("ev"),
            s("p"),
            Value::Bytes(Bytes::from_static(&[0, 255, 1])),
        ]);
        let e = decode("st", "5-1".into(), fields).unwrap();
        assert_eq!(e.name, "ev");
        assert_eq!(e.topic, None);
        assert_eq!(&e.payload[..], &[0, 255, 1]);
        assert_eq!(
            e.created_at(),
            SystemTime::UNIX_EPOCH + Duration::from_millis(5)
        );
        let bad = Value::Array(vec![s("x"), s("y")]);
        assert!(matches!(
            decode("st", "1-0".into(), bad),
            Err(Error::Malformed { .. })
        ));
        assert!(decode("st", "1-0".into(), Value::Integer(3)).is_err());
    }

    #[test]
    fn parses_replies() {
        let reply = Value::Array(vec![Value::Array(vec![
            s("k"),
            Value::Array(vec![
                Value::Array(vec![
                    s("1-0"),
                    Value::Array(vec![s("n"), s("a"), s("p"), s("")]),
                ]),
                Value::Array(vec![s("2-0"), Value::Null]),
            ]),
        ])]);
        let parsed = parse_xread(reply);
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].1.len(), 2);
        assert!(parsed[0].1[1].1.is_none());
        assert!(parse_xread(Value::Null).is_empty());
    }
}
