//! A closing worker's memory left with workers that stay
//! (`entrust.lua`, `entrusted_left.lua`; see `crate::custody`).

use std::time::Duration;

use bytes::Bytes;
use fred::types::Value;

use super::PoolStore;
use crate::error::{Error, Result};
use crate::keys;

/// What `entrust.lua` did with one `keep` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entrusted {
    /// In the receiving worker's inbox as entry `id`, while Redis was
    /// `identity` (`"<run id> <generation>"`).
    Left { id: String, identity: String },
    /// The receiving worker is not active (gone, being cleaned up,
    /// drained, or not registered again yet after a loss).
    NoTarget,
    /// The receiving worker is silent for over a TTL: its process died
    /// (nobody cleaned it up yet).
    Silent,
    /// The receiving worker is not registered, or silent, while the pool
    /// recovers from a loss of Redis's data: a live one registers again, and
    /// renews, within a renewal period.
    Recovering,
}

impl PoolStore {
    /// Leaves `entry` (an encoded `keep` entry) in the inbox of `worker`
    /// (`inbox`), if that worker is active and renewed within `ttl`.
    pub(crate) async fn entrust(
        &self,
        worker: &str,
        inbox: &str,
        entry: Bytes,
        ttl: Duration,
    ) -> Result<Entrusted> {
        const WHAT: &str = "entrust reply";
        let mut keys = self.maps.base_keys();
        keys.push(inbox.to_string());
        keys.push(self.maps.cleanup.keys_info().hash.clone());
        keys.push(self.maps.keepalive.keys_info().hash.clone());
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(worker),
            Value::Bytes(entry),
            Value::from(keys::INBOX_MAXLEN.to_string()),
            Value::from(ttl.as_millis().to_string()),
        ]);
        let reply: Value = self
            .scripts
            .entrust
            .run(&self.client, keys, args, self.timeout)
            .await?;
        match reply {
            Value::Array(items) if items.is_empty() => Ok(Entrusted::NoTarget),
            Value::Null => Ok(Entrusted::NoTarget),
            Value::Array(items) if items.len() == 1 => {
                match super::call::string_at(&items, 0).as_str() {
                    "silent" => Ok(Entrusted::Silent),
                    "recovering" => Ok(Entrusted::Recovering),
                    other => Err(Error::Malformed {
                        what: WHAT,
                        reason: format!("unknown answer {other:?}"),
                    }),
                }
            }
            Value::Array(items) if items.len() == 2 => Ok(Entrusted::Left {
                id: super::call::string_at(&items, 0),
                identity: super::call::string_at(&items, 1),
            }),
            other => Err(Error::Malformed {
                what: WHAT,
                reason: format!("expected {{id, identity}}, {{answer}} or {{}}, got {other:?}"),
            }),
        }
    }

    /// Whether the pool recovers from a loss of Redis's data (`entrust.lua`
    /// asked about no worker; `stream`, any stream key of the pool's slot,
    /// is not written).
    pub(crate) async fn pool_recovering(&self, stream: &str, ttl: Duration) -> Result<bool> {
        let answer = self.entrust("", stream, Bytes::new(), ttl).await?;
        Ok(answer == Entrusted::Recovering)
    }

    /// Which of the `keep` entries `left`, `(inbox, entry id, receiving
    /// worker)`, are still unread: Redis's identity now, and for each one
    /// unread its position in `left` and whether its worker will still
    /// read it (active, renewed within `ttl`).
    pub(crate) async fn entrusted_left(
        &self,
        left: &[(String, String, String)],
        ttl: Duration,
    ) -> Result<(String, Vec<(usize, bool)>)> {
        const WHAT: &str = "entrusted_left reply";
        let mut keys = self.maps.base_keys();
        keys.push(self.maps.cleanup.keys_info().hash.clone());
        keys.push(self.maps.keepalive.keys_info().hash.clone());
        let mut args = self.maps.base_args_with_ttl(ttl);
        for (inbox, id, worker) in left {
            keys.push(inbox.clone());
            args.extend([Value::from(id.as_str()), Value::from(worker.as_str())]);
        }
        let reply: Value = self
            .scripts
            .entrusted_left
            .run(&self.client, keys, args, self.timeout)
            .await?;
        let Value::Array(items) = reply else {
            return Err(Error::Malformed {
                what: WHAT,
                reason: format!("expected an array, got {reply:?}"),
            });
        };
        let identity = super::call::string_at(&items, 0);
        let unread = items[1.min(items.len())..]
            .iter()
            .map(|item| {
                let at = item.as_i64().unwrap_or(0);
                let position = usize::try_from(at.unsigned_abs())
                    .ok()
                    .and_then(|p| p.checked_sub(1))
                    .filter(|p| *p < left.len())
                    .ok_or_else(|| Error::Malformed {
                        what: WHAT,
                        reason: format!("no entry {item:?} among {}", left.len()),
                    })?;
                Ok((position, at > 0))
            })
            .collect::<Result<Vec<(usize, bool)>>>()?;
        Ok((identity, unread))
    }
}
