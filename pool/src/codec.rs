//! Wire format of the pool's inbox and reply events: MessagePack with a
//! leading version byte. Job payloads travel as opaque bytes.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Version byte written before every encoded event.
const VERSION: u8 = 1;

/// Stream event names (the `name` of a streaming entry).
pub(crate) const EV_START: &str = "start";
pub(crate) const EV_STOP: &str = "stop";
pub(crate) const EV_NOTIFY: &str = "notify";
pub(crate) const EV_MESSAGE: &str = "message";
/// What a closing worker remembered of some jobs, left with a worker that
/// stays ([`KeptJobs`]).
pub(crate) const EV_KEEP: &str = "keep";
/// A reply stream entry answering several requests, one
/// `"<request> <status>"` line each (see `scripts/record_starts.lua`).
pub(crate) const EV_REPLIES: &str = "replies";

/// The body of a job as stored in the payloads hash and carried by start
/// entries: its key and opaque payload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct JobBody {
    /// Job key.
    pub(crate) key: String,
    /// Opaque payload.
    #[serde(with = "serde_bytes")]
    pub(crate) payload: Vec<u8>,
    /// The dispatch's restart policy, if it set one (else the worker's
    /// node's applies). Absent in bodies written without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) restart: Option<crate::lifecycle::RestartPolicy>,
}

/// A [`JobBody`] borrowed from a dispatch's arguments: it encodes to the
/// same bytes, without copying the key and payload into a body first.
#[derive(Debug, Serialize)]
pub(crate) struct JobBodyRef<'a> {
    /// Job key.
    pub(crate) key: &'a str,
    /// Opaque payload.
    #[serde(with = "serde_bytes")]
    pub(crate) payload: &'a [u8],
    /// The dispatch's restart policy, if it set one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) restart: Option<crate::lifecycle::RestartPolicy>,
}

/// A `keep` entry: what a closing worker remembered of some of its jobs,
/// left with one worker that stays (see `custody.rs`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct KeptJobs {
    /// The jobs.
    pub(crate) jobs: Vec<KeptJob>,
}

/// What a closing worker remembered of one job (a hand-off, an orphan it
/// left, a run it saw end), which the worker that reads it remembers from
/// then on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct KeptJob {
    /// Job key.
    pub(crate) key: String,
    /// The fencing token of the run passed on (for an ended run: the
    /// key's counter, up to which every run is over).
    pub(crate) token: u64,
    /// The job's admission stamp (see [`stamp_us`]).
    #[serde(rename = "created_at_ms")]
    pub(crate) admitted: u64,
    /// The encoded [`JobBody`] (empty for an ended run).
    #[serde(with = "serde_bytes")]
    pub(crate) body: Vec<u8>,
    /// The key's fencing counter when Redis showed the run ended.
    pub(crate) ended_at: Option<u64>,
    /// How much longer it is remembered (ms).
    pub(crate) keep_ms: u64,
    /// With `ended_at`, what that end ended when it ended a whole dispatch
    /// (the dispatch's admission stamp, µs, or a stop's tombstone for a
    /// stop of the whole key); `None` from a build before (made to stand
    /// as a run's end).
    #[serde(default)]
    pub(crate) ended_dispatch: Option<u64>,
}

/// A start entry: `"<token> <admitted> <hops> <request> <node>\n"` written
/// by the admitting script (which issues the token on Redis), then the
/// encoded [`JobBody`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StartEntry {
    /// Fencing token issued at admission.
    pub(crate) token: u64,
    /// The job's admission stamp (see [`stamp_us`]).
    pub(crate) admitted: u64,
    /// Times a worker forwarded this entry.
    pub(crate) hops: u8,
    /// Who waits for the outcome (request 0: nobody).
    pub(crate) reply: Option<ReplyTo>,
    /// The job.
    pub(crate) body: JobBody,
    /// The encoded body, kept to forward the entry unchanged.
    pub(crate) raw_body: Bytes,
}

impl StartEntry {
    /// Parses a start entry's payload.
    pub(crate) fn parse(bytes: &Bytes) -> Result<StartEntry> {
        let bad = |reason: &str| Error::Malformed {
            what: "start entry",
            reason: reason.to_string(),
        };
        let nl = bytes
            .iter()
            .position(|b| *b == b'\n')
            .ok_or_else(|| bad("no header"))?;
        let header = std::str::from_utf8(&bytes[..nl]).map_err(|_| bad("header not UTF-8"))?;
        let mut parts = header.split(' ');
        let mut next = |name: &str| parts.next().ok_or_else(|| bad(name));
        let token = next("token")?.parse().map_err(|_| bad("token"))?;
        let admitted = next("admitted")?.parse().map_err(|_| bad("admitted"))?;
        let hops = next("hops")?.parse().map_err(|_| bad("hops"))?;
        let request: u64 = next("request")?.parse().map_err(|_| bad("request"))?;
        let node = next("node")?;
        let reply = (request != 0).then(|| ReplyTo {
            node: node.to_string(),
            request,
        });
        let raw_body = bytes.slice(nl + 1..);
        let body = decode("job body", &raw_body)?;
        Ok(StartEntry {
            token,
            admitted,
            hops,
            reply,
            body,
            raw_body,
        })
    }

    /// Re-encodes the entry with one more hop, for forwarding.
    pub(crate) fn forwarded(&self) -> Bytes {
        let (request, node) = match &self.reply {
            Some(r) => (r.request, r.node.as_str()),
            None => (0, "-"),
        };
        let mut out = format!(
            "{} {} {} {} {}\n",
            self.token,
            self.admitted,
            self.hops.saturating_add(1),
            request,
            node
        )
        .into_bytes();
        out.extend_from_slice(&self.raw_body);
        Bytes::from(out)
    }
}

/// A request addressed to the owner of a job key (stop, notify) or to the
/// ring owner of a key (message).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct KeyedRequest {
    /// Job key (or message key).
    pub(crate) key: String,
    /// Opaque payload (empty for stop).
    #[serde(with = "serde_bytes")]
    pub(crate) payload: Vec<u8>,
    /// Where to send the outcome, when a caller waits.
    pub(crate) reply: Option<ReplyTo>,
    /// How many times a worker forwarded this request (bounded).
    pub(crate) hops: u8,
}

/// Reply address: a node's reply stream and the waiting request's id.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct ReplyTo {
    /// Node id of the waiting dispatcher.
    pub(crate) node: String,
    /// Request id unique on that node (never 0).
    pub(crate) request: u64,
}

/// The outcome of a request, as a worker's script wrote it:
/// `"<request> <status>[ <message>]"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    /// The request answered.
    pub(crate) request: u64,
    /// `ok`, `superseded`, `not_found`, `failed`, ...
    pub(crate) status: String,
    /// Error text for `failed`.
    pub(crate) message: String,
}

impl Reply {
    /// Parses a reply entry's payload.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Reply> {
        let text = String::from_utf8_lossy(bytes);
        let mut parts = text.splitn(3, ' ');
        let request =
            parts
                .next()
                .and_then(|r| r.parse().ok())
                .ok_or_else(|| Error::Malformed {
                    what: "reply",
                    reason: format!("bad request id in {text:?}"),
                })?;
        let status = parts.next().unwrap_or_default().to_string();
        let message = parts.next().unwrap_or_default().to_string();
        Ok(Reply {
            request,
            status,
            message,
        })
    }
}

/// Stamps below this are milliseconds, not microseconds (10^14 µs is 1973;
/// 10^14 ms is 5138): payloads and start entries written by builds before
/// the stamp was the admission's token.
const STAMP_US_FROM: u64 = 100_000_000_000_000;

/// A job's admission stamp in µs of server time. The stamp is the fencing
/// token its admission issued (`admit.lua`): unique to that admission among
/// every admission of the key, so two dispatches of one key made within a
/// millisecond are told apart (a stop of one must not reach the next), and
/// kept unchanged by every requeue, hand-off and move of that dispatch.
/// Older stamps (ms of server time) are scaled.
pub(crate) fn stamp_us(stamp: u64) -> u64 {
    if stamp < STAMP_US_FROM {
        stamp.saturating_mul(1000)
    } else {
        stamp
    }
}

/// Whether `stamp` is an admission's token (unique to one dispatch of its
/// key), not a time in ms written by an earlier build.
pub(crate) fn stamp_is_exact(stamp: u64) -> bool {
    stamp >= STAMP_US_FROM
}

/// A job's admission stamp (see [`stamp_us`]) in ms of server time: when it
/// was first admitted.
pub(crate) fn stamp_ms(stamp: u64) -> u64 {
    stamp_us(stamp) / 1000
}

/// Splits a stored payload (`"<admitted> <body>"`) into its admission
/// stamp (see [`stamp_us`]) and its decoded body.
pub(crate) fn parse_stored(bytes: &[u8]) -> Result<(u64, JobBody)> {
    let (admitted, body) = split_stored(bytes).ok_or_else(|| Error::Malformed {
        what: "stored payload",
        reason: "no admission stamp before the body".to_string(),
    })?;
    Ok((admitted, decode("job body", body)?))
}

/// Splits a stored payload (see [`stored`]) into its admission stamp and
/// its body, undecoded.
pub(crate) fn split_stored(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let sp = bytes.iter().position(|b| *b == b' ')?;
    let admitted = std::str::from_utf8(&bytes[..sp]).ok()?.parse().ok()?;
    Some((admitted, &bytes[sp + 1..]))
}

/// Encodes a stored payload (`"<admitted> <body>"`, the stamp unchanged).
pub(crate) fn stored(admitted: u64, body: &[u8]) -> Bytes {
    let mut out = format!("{admitted} ").into_bytes();
    out.extend_from_slice(body);
    Bytes::from(out)
}

/// Encodes a value with the version byte.
pub(crate) fn encode<T: Serialize>(value: &T) -> Bytes {
    let mut out = vec![VERSION];
    // Serializing our own plain structs into a Vec cannot fail.
    if let Err(e) = rmp_serde::encode::write(&mut out, value) {
        tracing::error!(error = %e, "encoding an event failed");
    }
    Bytes::from(out)
}

/// Decodes a value written by [`encode`].
pub(crate) fn decode<'a, T: Deserialize<'a>>(what: &'static str, bytes: &'a [u8]) -> Result<T> {
    match bytes.split_first() {
        Some((&VERSION, rest)) => rmp_serde::from_slice(rest).map_err(|e| Error::Malformed {
            what,
            reason: e.to_string(),
        }),
        Some((v, _)) => Err(Error::Malformed {
            what,
            reason: format!("unknown version byte {v}"),
        }),
        None => Err(Error::Malformed {
            what,
            reason: "empty".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_entry_round_trips_binary_payload() {
        let body = encode(&JobBody {
            key: "k 1".into(),
            payload: vec![0, 255, b'\n', 2],
            restart: None,
        });
        let mut raw = b"7 42 0 9 node-a\n".to_vec();
        raw.extend_from_slice(&body);
        let entry = StartEntry::parse(&Bytes::from(raw)).unwrap();
        assert_eq!(entry.token, 7);
        assert_eq!(entry.admitted, 42);
        assert_eq!(entry.body.payload, vec![0, 255, b'\n', 2]);
        assert_eq!(entry.reply.as_ref().unwrap().node, "node-a");
        let again = StartEntry::parse(&entry.forwarded()).unwrap();
        assert_eq!(again.hops, 1);
        assert_eq!(again.body, entry.body);
    }

    #[test]
    fn a_borrowed_body_encodes_to_the_same_bytes() {
        for restart in [None, Some(crate::lifecycle::RestartPolicy::default())] {
            let owned = encode(&JobBody {
                key: "k 1".into(),
                payload: vec![0, 255, b'\n', 2],
                restart,
            });
            let borrowed = encode(&JobBodyRef {
                key: "k 1",
                payload: &[0, 255, b'\n', 2],
                restart,
            });
            assert_eq!(owned, borrowed);
        }
    }

    #[test]
    fn keep_entries_round_trip_ended_runs_and_bodies() {
        let kept = KeptJobs {
            jobs: vec![
                KeptJob {
                    key: "k".into(),
                    token: 7,
                    admitted: 11,
                    body: vec![0, 159, 146, 150],
                    ended_at: None,
                    keep_ms: 30_000,
                    ended_dispatch: None,
                },
                KeptJob {
                    key: "j".into(),
                    token: 9,
                    admitted: 0,
                    body: Vec::new(),
                    ended_at: Some(9),
                    keep_ms: 120_000,
                    ended_dispatch: Some(8),
                },
            ],
        };
        let back: KeptJobs = decode("keep entry", &encode(&kept)).unwrap();
        assert_eq!(back, kept);
        // An entry a build before wrote (no `ended_dispatch`) reads as a
        // run's end.
        #[derive(Serialize)]
        struct Before {
            key: String,
            token: u64,
            admitted: u64,
            #[serde(with = "serde_bytes")]
            body: Vec<u8>,
            ended_at: Option<u64>,
            keep_ms: u64,
        }
        #[derive(Serialize)]
        struct BeforeJobs {
            jobs: Vec<Before>,
        }
        let before = BeforeJobs {
            jobs: vec![Before {
                key: "j".into(),
                token: 9,
                admitted: 0,
                body: Vec::new(),
                ended_at: Some(9),
                keep_ms: 120_000,
            }],
        };
        let back: KeptJobs = decode("keep entry", &encode(&before)).unwrap();
        assert_eq!(back.jobs[0].ended_at, Some(9));
        assert_eq!(back.jobs[0].ended_dispatch, None);
        assert!(
            decode::<KeptJobs>(
                "keep entry",
                &encode(&JobBody {
                    key: "k".into(),
                    payload: vec![1],
                    restart: None,
                })
            )
            .is_err()
        );
    }

    #[test]
    fn garbage_is_a_typed_error() {
        assert!(decode::<JobBody>("body", b"").is_err());
        assert!(decode::<JobBody>("body", &[9, 1, 2]).is_err());
        assert!(StartEntry::parse(&Bytes::from_static(b"x y\n")).is_err());
        assert!(StartEntry::parse(&Bytes::from_static(b"no newline")).is_err());
        assert!(Reply::parse(b"abc ok").is_err());
        assert!(parse_stored(b"12").is_err());
    }

    #[test]
    fn reply_keeps_message_spaces() {
        let r = Reply::parse(b"5 failed boom: it broke").unwrap();
        assert_eq!(
            (r.request, r.status.as_str(), r.message.as_str()),
            (5, "failed", "boom: it broke")
        );
    }
}
