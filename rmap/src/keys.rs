//! Redis key and channel names of a map. The only place that knows them.

use crate::error::Error;

/// The longest name accepted by [`check_name`], in bytes.
pub const MAX_NAME_LEN: usize = 128;

/// The Redis key and channel names of one map.
///
/// Every name carries the same hash tag, so a script may touch all of them
/// (and other keys with that tag) on Redis Cluster.
///
/// | hash tag | hash | revision | channel |
/// |---|---|---|---|
/// | none (defaults to the name `N`) | `fl:{N}:map` | `fl:{N}:map:rev` | `fl:{N}:map:events` |
/// | `T` | `fl:{T}:map:N` | `fl:{T}:map:N:rev` | `fl:{T}:map:N:events` |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapKeys {
    /// The Redis hash holding the map's content.
    pub hash: String,
    /// The string key holding the map's revision (incremented on every write).
    pub revision: String,
    /// The sharded pub/sub channel on which every write is announced.
    pub channel: String,
}

impl MapKeys {
    /// The key names of map `name`, tagged with `hash_tag` (default: the name).
    ///
    /// # Errors
    /// [`Error::InvalidName`] when the name or tag breaks [`check_name`].
    pub fn new(name: &str, hash_tag: Option<&str>) -> Result<Self, Error> {
        check_name(name).map_err(|reason| Error::InvalidName {
            what: "map name",
            name: name.to_string(),
            reason,
        })?;
        let base = match hash_tag {
            None => format!("fl:{{{name}}}:map"),
            Some(tag) => {
                check_name(tag).map_err(|reason| Error::InvalidName {
                    what: "hash tag",
                    name: tag.to_string(),
                    reason,
                })?;
                format!("fl:{{{tag}}}:map:{name}")
            }
        };
        Ok(MapKeys {
            revision: format!("{base}:rev"),
            channel: format!("{base}:events"),
            hash: base,
        })
    }
}

/// The naming rule shared by every Flotilla crate (pools, maps, streams,
/// sinks, job keys): non-empty, at most [`MAX_NAME_LEN`] bytes, no `{`, `}`
/// or control characters.
///
/// # Errors
/// The reason the value is refused.
///
/// # Examples
/// ```
/// assert!(flotilla_rmap::check_name("jobs").is_ok());
/// assert!(flotilla_rmap::check_name("a{b}").is_err());
/// ```
pub fn check_name(value: &str) -> Result<(), &'static str> {
    if value.is_empty() {
        return Err("must not be empty");
    }
    if value.len() > MAX_NAME_LEN {
        return Err("must be at most 128 bytes");
    }
    if value.contains(['{', '}']) {
        return Err("must not contain '{' or '}'");
    }
    if value.chars().any(char::is_control) {
        return Err("must not contain control characters");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_without_tag() {
        let k = MapKeys::new("m", None).unwrap();
        assert_eq!(k.hash, "fl:{m}:map");
        assert_eq!(k.revision, "fl:{m}:map:rev");
        assert_eq!(k.channel, "fl:{m}:map:events");
    }

    #[test]
    fn layout_with_tag() {
        let k = MapKeys::new("jobs", Some("pool1")).unwrap();
        assert_eq!(k.hash, "fl:{pool1}:map:jobs");
        assert_eq!(k.revision, "fl:{pool1}:map:jobs:rev");
        assert_eq!(k.channel, "fl:{pool1}:map:jobs:events");
    }

    #[test]
    fn names_checked() {
        assert!(check_name("").is_err());
        assert!(check_name("a}").is_err());
        assert!(check_name("a\nb").is_err());
        assert!(check_name(&"x".repeat(129)).is_err());
        assert!(check_name(&"x".repeat(128)).is_ok());
        assert!(check_name("héllo:world").is_ok());
        assert!(matches!(
            MapKeys::new("ok", Some("{bad")),
            Err(Error::InvalidName {
                what: "hash tag",
                ..
            })
        ));
    }
}
