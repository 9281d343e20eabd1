//! Cursors that went past the stream: after a reconnection Redis may have
//! gone back in time (a Sentinel failover to a replica that missed the
//! newest entries, a restart from an older AOF or snapshot). New entries
//! then get ids from the restored stream's newest id, possibly below a
//! reader's cursor (when the new primary's clock is behind the old one's,
//! or when lost entries carried explicit ids), and an `XREAD` after the
//! cursor would skip them until the clock catches up.
//!
//! After every reconnection the reader compares each cursor with the
//! stream's newest id. When the cursor is ahead, it moves back to the newest
//! entry it had already delivered that still exists: entries below the
//! cursor that it never delivered (added after the rollback) are read, the
//! survivors it delivered are not read again. The reader remembers the ids
//! of its last [`History::KEEP`] deliveries per stream for this; with more
//! entries added after the rollback than that, the oldest of them are
//! skipped.

use std::collections::{HashSet, VecDeque};

use fred::prelude::*;
use fred::types::Value;

use crate::Error;

/// The id of the newest entry of `key`, `0-0` when it is empty or absent.
pub(crate) async fn newest_id(conn: &Client, key: &str) -> Result<String, Error> {
    let v: Value = conn.xrevrange(key, "+", "-", Some(1)).await?;
    Ok(crate::event::parse_entries(v)
        .into_iter()
        .next()
        .map_or_else(|| "0-0".to_string(), |(id, _)| id))
}

/// The ids of a reader's last deliveries from one stream, oldest first.
#[derive(Debug, Default)]
pub(crate) struct History {
    ids: VecDeque<String>,
}

impl History {
    /// How many delivered ids are kept per stream.
    pub(crate) const KEEP: usize = 1024;

    /// Notes a delivered (or skipped) id.
    pub(crate) fn push(&mut self, id: String) {
        if self.ids.len() == Self::KEEP {
            self.ids.pop_front();
        }
        self.ids.push_back(id);
    }

    /// Where to read on from, given the ids of the stream's entries up to
    /// the cursor, newest first (`complete` when that is all of them): the
    /// newest one that was delivered (kept here, or older than everything
    /// kept here, so delivered before).
    pub(crate) fn resume_from(&self, newest_first: &[String], complete: bool) -> String {
        let Some(oldest_kept) = self.ids.front() else {
            // Nothing delivered yet: every entry up to the cursor is old.
            return newest_first
                .first()
                .cloned()
                .unwrap_or_else(|| "0-0".into());
        };
        let kept: HashSet<&str> = self.ids.iter().map(String::as_str).collect();
        for id in newest_first {
            if kept.contains(id.as_str()) || is_before(id, oldest_kept) {
                return id.clone();
            }
        }
        if complete {
            "0-0".into()
        } else {
            newest_first.last().cloned().unwrap_or_else(|| "0-0".into())
        }
    }
}

/// The ids of the entries of `key` up to `cursor`, newest first, at most
/// [`History::KEEP`].
pub(crate) async fn ids_up_to(
    conn: &Client,
    key: &str,
    cursor: &str,
) -> Result<Vec<String>, Error> {
    let v: Value = conn
        .xrevrange(key, cursor, "-", Some(History::KEEP as u64))
        .await?;
    Ok(crate::event::parse_entries(v)
        .into_iter()
        .map(|(id, _)| id)
        .collect())
}

/// Whether stream id `a` is before `b` (`ms-seq`, compared as numbers; an
/// id that does not parse is never before anything).
pub(crate) fn is_before(a: &str, b: &str) -> bool {
    match (parse(a), parse(b)) {
        (Some(a), Some(b)) => a < b,
        _ => false,
    }
}

fn parse(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_compare_as_numbers() {
        assert!(is_before("9-0", "10-0"));
        assert!(is_before("10-2", "10-10"));
        assert!(!is_before("10-0", "10-0"));
        assert!(is_before("0-0", "1700000000000-0"));
        assert!(!is_before("junk", "1-0"));
        assert!(is_before("5", "5-1"));
    }

    #[test]
    fn resumes_after_the_newest_delivered_survivor() {
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut h = History::default();
        for id in ["10-0", "11-0", "12-0", "90-0"] {
            h.push(id.into());
        }
        // 90 was lost; 13 and 14 were added after the rollback.
        assert_eq!(
            h.resume_from(&ids(&["14-0", "13-0", "12-0", "11-0"]), true),
            "12-0"
        );
        // Everything kept was lost, older entries survive: they were delivered.
        assert_eq!(h.resume_from(&ids(&["14-0", "5-0"]), true), "5-0");
        // Only new entries remain.
        assert_eq!(h.resume_from(&ids(&["14-0", "13-0"]), true), "0-0");
        assert_eq!(h.resume_from(&ids(&["14-0", "13-0"]), false), "13-0");
        // Nothing delivered yet: what exists is old.
        assert_eq!(
            History::default().resume_from(&ids(&["14-0"]), true),
            "14-0"
        );
    }

    #[test]
    fn history_is_bounded() {
        let mut h = History::default();
        for i in 0..(History::KEEP as u64 + 10) {
            h.push(format!("{i}-0"));
        }
        assert_eq!(h.ids.len(), History::KEEP);
        assert_eq!(h.ids.front().map(String::as_str), Some("10-0"));
    }
}
