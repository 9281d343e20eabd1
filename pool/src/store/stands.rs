//! Runs and stops made to stand again after Redis went back in time: a
//! hand-off given back (`handoff_stands.lua`), the hand-offs that ended
//! since (`handoffs_ended.lua`), and stops Redis lost (`stop_stands.lua`).

use bytes::Bytes;
use fred::types::Value;

use super::PoolStore;
use super::call;
use crate::error::Result;
use crate::keys;

/// The name of `stop_stands.lua`'s reply in errors.
const WHAT: &str = "stop_stands reply";

/// What `handoff_stands.lua` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandoffStands {
    /// The payload is back: the job is an orphan until it is re-asserted
    /// or requeued.
    Restored,
    /// The key is owned or pending, or its payload is there.
    Kept,
    /// Redis holds the hand-off's token or a newer one.
    Current,
    /// A run of this dispatch ended where the Sentinels name the primary,
    /// and the giver's node wrote to a superseded one: the hand-off may
    /// have been made there, and is not given back.
    Ended,
    /// A run or pending start of an older dispatch (admitted at this
    /// stamp, µs) holds the key: marked over, and the payload waits for its
    /// end (see [`Reasserted::Superseded`](super::Reasserted::Superseded));
    /// the caller stops it.
    Superseded(u64),
}

impl HandoffStands {
    /// Reads one of `handoff_stands.lua`'s statuses.
    fn parse(status: &str) -> Result<Self> {
        Ok(match status {
            "restored" => Self::Restored,
            "kept" => Self::Kept,
            "current" => Self::Current,
            "ended" => Self::Ended,
            other => match call::superseded(other) {
                Some(older) => Self::Superseded(older),
                None => return Err(call::unknown_status("handoff_stands reply", other)),
            },
        })
    }
}

/// What `stop_stands.lua` did with one stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopStands {
    /// Records, guard or payload of the stopped run (or older) removed.
    Removed,
    /// A newer run of the key is recorded or pending: left alone.
    Newer,
    /// Nothing of the stopped run was there.
    None,
    /// A stop `stop_job` asked for ([`StopKind::Dispatch`]) was undone: a
    /// run of the stopped dispatch, issued after the stop, is recorded,
    /// pending or owed by the orphan sweep. Nothing was removed; the
    /// caller stops that dispatch (the admission stamp of its payload, µs,
    /// see `codec::stamp_us`) through its worker.
    Undone(u64),
}

impl StopStands {
    /// The script's word for this status (without the admission stamp).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StopStands::Removed => "removed",
            StopStands::Newer => "newer",
            StopStands::None => "none",
            StopStands::Undone(_) => "undone",
        }
    }

    /// Reads the script's status.
    fn parse(status: &str) -> Result<Self> {
        Ok(match status.split_once(' ') {
            None if status == "removed" => StopStands::Removed,
            None if status == "newer" => StopStands::Newer,
            None if status == "none" => StopStands::None,
            Some(("undone", admitted)) => match admitted.parse() {
                Ok(admitted) => StopStands::Undone(admitted),
                Err(_) => return Err(call::unknown_status(WHAT, status)),
            },
            _ => return Err(call::unknown_status(WHAT, status)),
        })
    }
}

/// Which stop `stop_stands.lua` makes stand again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopKind {
    /// One run a worker stopped or ended (a newer run of the same dispatch
    /// may be a hand-off of it, and goes on).
    Run,
    /// A stop `stop_job` asked for and was answered, or a run's end Redis
    /// recorded as its dispatch's (finished, failed for good): it ended the
    /// whole dispatch, and a newer run of it undoes the end (the dispatch
    /// is marked over in Redis, see `stop_stands.lua`).
    Dispatch,
}

/// What `handoffs_ended.lua` found of the jobs a worker remembers passing
/// on, by their positions in the question.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HandoffsSettled {
    /// Ended since: each position, and the key's fencing counter then.
    pub(crate) ended: Vec<(usize, u64)>,
    /// Waiting to start (a payload, no record): each position, and the
    /// admission stamp (µs) of the payload Redis holds (the only copy).
    pub(crate) waiting: Vec<(usize, u64)>,
    /// Nothing of the key left, its counter raised past the token only by
    /// the ends of older dispatches (after a rollback): each position. The
    /// worker gives such a job back (`handoff_stands.lua`).
    pub(crate) passed: Vec<usize>,
}

impl PoolStore {
    /// Gives back the stored payload of job `key`, handed off lately with
    /// fencing token `token`, after Redis went back in time, if nothing
    /// newer happened to the key (see `handoff_stands.lua`).
    pub(crate) async fn handoff_stands(
        &self,
        key: &str,
        token: u64,
        stored: Bytes,
    ) -> Result<HandoffStands> {
        let mut statuses = self
            .handoff_stands_batch(vec![(key, token, stored)])
            .await?;
        Ok(statuses.remove(0))
    }

    /// [`handoff_stands`](Self::handoff_stands) for many jobs
    /// `(key, token, stored payload)` in one call: one status each, in
    /// order.
    pub(crate) async fn handoff_stands_batch(
        &self,
        jobs: Vec<(&str, u64, Bytes)>,
    ) -> Result<Vec<HandoffStands>> {
        let count = jobs.len();
        let mut args = self.maps.base_args();
        args.reserve(1 + 3 * count);
        args.push(Value::from(if self.diverged() { "yielding" } else { "" }));
        for (key, token, stored) in jobs {
            args.extend([
                Value::from(key),
                Value::from(token.to_string()),
                Value::Bytes(stored),
            ]);
        }
        let mut keys = self.maps.base_keys();
        keys.push(keys::orphan_marks(&self.pool));
        let statuses: Vec<Value> = self
            .scripts
            .handoff_stands
            .run(&self.client, keys, args, self.timeout)
            .await?;
        call::statuses(
            "handoff_stands reply",
            count,
            &statuses,
            HandoffStands::parse,
        )
    }

    /// Which of `jobs`, `(key, token, admission stamp µs)` a worker
    /// remembers passing on, ended since (see `handoffs_ended.lua`): each
    /// one's position in `jobs` and the key's fencing counter, up to which
    /// every run is over; which still wait to start anywhere; and which
    /// only ends of older dispatches passed.
    pub(crate) async fn handoffs_ended(
        &self,
        jobs: &[(String, u64, u64)],
    ) -> Result<HandoffsSettled> {
        const WHAT: &str = "handoffs_ended reply";
        let mut args = self.maps.base_args();
        for (key, token, admitted) in jobs {
            args.extend([
                Value::from(key.as_str()),
                Value::from(token.to_string()),
                Value::from(admitted.to_string()),
            ]);
        }
        let reply: Vec<Value> = self
            .scripts
            .handoffs_ended
            .run(&self.client, self.maps.base_keys(), args, self.timeout)
            .await?;
        let list = |at: usize| match reply.get(at) {
            Some(Value::Array(values)) => Ok(values.as_slice()),
            Some(Value::Null) => Ok(&[][..]),
            other => Err(crate::error::Error::Malformed {
                what: WHAT,
                reason: format!("expected three arrays, got {other:?} at {at}"),
            }),
        };
        let position = |values: &[Value], at: usize| {
            let pair = super::call::u64_at(values, at, WHAT)?;
            usize::try_from(pair)
                .ok()
                .and_then(|p| p.checked_sub(1))
                .filter(|p| *p < jobs.len())
                .ok_or_else(|| crate::error::Error::Malformed {
                    what: WHAT,
                    reason: format!("no pair {pair} among {}", jobs.len()),
                })
        };
        let (ended, waiting, passed) = (list(0)?, list(1)?, list(2)?);
        Ok(HandoffsSettled {
            ended: (0..ended.len() / 2)
                .map(|i| {
                    Ok((
                        position(ended, 2 * i)?,
                        super::call::u64_at(ended, 2 * i + 1, WHAT)?,
                    ))
                })
                .collect::<Result<_>>()?,
            waiting: (0..waiting.len() / 2)
                .map(|i| {
                    Ok((
                        position(waiting, 2 * i)?,
                        super::call::u64_at(waiting, 2 * i + 1, WHAT)?,
                    ))
                })
                .collect::<Result<_>>()?,
            passed: (0..passed.len())
                .map(|i| position(passed, i))
                .collect::<Result<_>>()?,
        })
    }

    /// Makes a stop of the run of `key` with fencing token `stopped` stand
    /// again after Redis went back in time (see `stop_stands.lua`).
    /// The stop of one run ([`StopKind::Run`]).
    pub(crate) async fn stop_stands(&self, key: &str, stopped: u64) -> Result<StopStands> {
        let mut statuses = self
            .stop_stands_batch(&[(key, stopped)], StopKind::Run)
            .await?;
        Ok(statuses.remove(0))
    }

    /// [`stop_stands`](Self::stop_stands) for many stops `(key, token)` of
    /// one kind in one call: one status each, in order.
    pub(crate) async fn stop_stands_batch(
        &self,
        stops: &[(&str, u64)],
        kind: StopKind,
    ) -> Result<Vec<StopStands>> {
        let stops: Vec<(&str, u64, u64)> = stops.iter().map(|(k, t)| (*k, *t, 0)).collect();
        self.stops_stand_yielding(&stops, kind, false).await
    }

    /// [`stop_stands_batch`](Self::stop_stands_batch) for stops a node made
    /// stand after a recovery: `yielding` when it wrote to a primary that
    /// stalled through its failover, where some of them may have been
    /// carried out under tokens the promoted side's do not compare with
    /// (`stop_stands.lua` then leaves every record and guard).
    /// Each stop is `(key, token, dispatch)`: `dispatch`, the admission
    /// stamp (µs) of the one dispatch the stop ended (0: every dispatch
    /// admitted before `token`, as a stop of the key ends).
    pub(crate) async fn stops_stand_yielding(
        &self,
        stops: &[(&str, u64, u64)],
        kind: StopKind,
        yielding: bool,
    ) -> Result<Vec<StopStands>> {
        let whole = match kind {
            StopKind::Run => "0",
            StopKind::Dispatch => "1",
        };
        let mut args = self.maps.base_args();
        args.reserve(1 + 4 * stops.len());
        args.push(Value::from(if yielding { "yielding" } else { "" }));
        for (key, stopped, dispatch) in stops {
            args.extend([
                Value::from(*key),
                Value::from(stopped.to_string()),
                Value::from_static_str(whole),
                Value::from(dispatch.to_string()),
            ]);
        }
        let statuses: Vec<Value> = self
            .scripts
            .stop_stands
            .run(&self.client, self.maps.base_keys(), args, self.timeout)
            .await?;
        call::statuses(WHAT, stops.len(), &statuses, StopStands::parse)
    }
}
