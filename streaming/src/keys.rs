//! The only place that knows this crate's Redis key names.
//!
//! * A stream without a hash tag: `fl:{<name>}:stream`.
//! * A stream with hash tag `T`: `fl:{T}:stream:<name>`.
//! * A sink's member keep-alives: the replicated map (`flotilla-rmap`)
//!   named `sink:<sink>` with hash tag `T`, the sink's hash tag (the
//!   streams' tag); rmap owns its keys.

/// The Redis key of a stream.
pub(crate) fn stream_key(name: &str, hash_tag: Option<&str>) -> String {
    match hash_tag {
        None => format!("fl:{{{name}}}:stream"),
        Some(tag) => format!("fl:{{{tag}}}:stream:{name}"),
    }
}

/// The hash tag a stream's key carries (without braces).
pub(crate) fn stream_tag<'a>(name: &'a str, hash_tag: Option<&'a str>) -> &'a str {
    hash_tag.unwrap_or(name)
}

/// The rmap name of a sink's member keep-alives.
pub(crate) fn sink_members_map(sink: &str) -> String {
    format!("sink:{sink}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        assert_eq!(stream_key("s", None), "fl:{s}:stream");
        assert_eq!(stream_key("inbox:w1", Some("p")), "fl:{p}:stream:inbox:w1");
        assert_eq!(stream_tag("s", None), "s");
        assert_eq!(stream_tag("s", Some("p")), "p");
        assert_eq!(sink_members_map("k"), "sink:k");
    }
}
