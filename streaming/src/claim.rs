//! A sink's background upkeep: keep-alive, claiming idle events, removing
//! stale members, and handing events over on close.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use fred::prelude::*;
use fred::types::Value;
use fred::types::scripts::Script;

use crate::Error;
use crate::event::parse_entries;
use crate::members::MemberView;
use crate::sink::Shared;
use crate::stale::{TakeOver, take_over};

static DELCONSUMER_IF_EMPTY: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(include_str!("scripts/delconsumer_if_empty.lua")));

/// Entries per `XPENDING`/`XCLAIM` page.
const PAGE: u64 = 100;
/// Pages per stream and round, so one round's work is bounded.
const MAX_PAGES: usize = 20;

/// Renews this member's keep-alive every third of `member_ttl`.
pub(crate) async fn keepalive_loop(shared: Arc<Shared>) {
    let period = shared.options.member_ttl / 3;
    loop {
        if let Err(e) = shared.members.renew(&shared.member_id).await {
            tracing::warn!(sink = %shared.group, error = %e, "sink keep-alive failed");
        }
        tokio::select! {
            _ = shared.cancel.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}

/// Claims idle events and cleans stale members, at start and then every
/// `min(ack_grace / 2, member_ttl / 3)`; only while a subscriber exists
/// (claimed events are delivered to this member).
pub(crate) async fn claim_loop(shared: Arc<Shared>) {
    let period = (shared.options.ack_grace / 2)
        .min(shared.options.member_ttl / 3)
        .max(Duration::from_millis(10));
    loop {
        if !shared.wait_subscriber().await {
            return;
        }
        let round = tokio::select! {
            _ = shared.cancel.cancelled() => return,
            r = claim_round(&shared) => r,
        };
        if let Err(e) = round {
            tracing::warn!(sink = %shared.group, error = %e, "sink claim round failed");
        }
        tokio::select! {
            _ = shared.cancel.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}

async fn claim_round(shared: &Shared) -> Result<(), Error> {
    let view = shared.members.view().await?;
    let ttl_ms = shared.options.member_ttl.as_millis() as u64;
    let alone = !view
        .members
        .keys()
        .any(|m| *m != shared.member_id && view.is_live(m, ttl_ms));
    // Suspects that Redis found alive, or that still own a consumer after
    // this round: their registration stays.
    let mut kept: HashSet<String> = HashSet::new();
    for (name, key) in shared.streams() {
        claim_idle(shared, &name, &key, alone).await?;
        for (consumer, idle) in consumers(shared, &key).await? {
            if consumer == shared.member_id {
                continue;
            }
            let suspect = match view.members.get(&consumer) {
                Some(_) => !view.is_live(&consumer, ttl_ms),
                None => idle > ttl_ms,
            };
            if !suspect {
                continue;
            }
            // The replica only picks suspects; Redis decides (it may say
            // the member is alive: the replica lags).
            if take_over(shared, &name, &key, &consumer).await? != TakeOver::Removed {
                kept.insert(consumer);
            }
        }
    }
    remove_stale_members(shared, &view, ttl_ms, &kept).await
}

/// Unregisters members the replica saw stale and that own no consumer any
/// more; each removal is conditional in Redis (the keep-alive there must
/// still be the stale one seen), so a member that renewed meanwhile stays.
async fn remove_stale_members(
    shared: &Shared,
    view: &MemberView,
    ttl_ms: u64,
    kept: &HashSet<String>,
) -> Result<(), Error> {
    for (member, &at) in &view.members {
        if *member != shared.member_id && !view.is_live(member, ttl_ms) && !kept.contains(member) {
            shared.members.remove_if(member, at).await?;
        }
    }
    Ok(())
}

/// Claims entries idle longer than the grace period: other members' always;
/// this member's own only when they are not with a subscriber (handed over
/// to us, or their delivery failed) or no other member is live.
async fn claim_idle(shared: &Shared, name: &str, key: &str, alone: bool) -> Result<(), Error> {
    let grace_ms = shared.options.ack_grace.as_millis() as u64;
    let mut start = "-".to_string();
    for _ in 0..MAX_PAGES {
        let pending: Value = shared
            .client
            .custom(
                fred::cmd!("XPENDING"),
                vec![
                    key.to_string(),
                    shared.group.clone(),
                    "IDLE".into(),
                    grace_ms.to_string(),
                    start.clone(),
                    "+".into(),
                    PAGE.to_string(),
                ],
            )
            .await?;
        let rows = pending_rows(pending);
        let Some(last) = rows.last() else {
            return Ok(());
        };
        start = format!("({}", last.0);
        let full = rows.len() as u64 == PAGE;
        let ids: Vec<String> = rows
            .into_iter()
            .filter(|(id, owner)| {
                *owner != shared.member_id || alone || !shared.is_in_flight(name, id)
            })
            .map(|(id, _)| id)
            .collect();
        if !ids.is_empty() {
            let entries =
                xclaim(shared, key, &shared.member_id, grace_ms, &ids, None, false).await?;
            if !entries.is_empty() {
                tracing::debug!(sink = %shared.group, stream = %name, count = entries.len(), "claimed idle events");
            }
            if !shared.deliver(name, key, entries).await {
                return Ok(());
            }
        }
        if !full {
            return Ok(());
        }
    }
    Ok(())
}

async fn pending_of(shared: &Shared, key: &str, consumer: &str) -> Result<Vec<String>, Error> {
    let pending: Value = shared
        .client
        .custom(
            fred::cmd!("XPENDING"),
            vec![
                key.to_string(),
                shared.group.clone(),
                "-".into(),
                "+".into(),
                PAGE.to_string(),
                consumer.to_string(),
            ],
        )
        .await?;
    Ok(pending_rows(pending)
        .into_iter()
        .map(|(id, _)| id)
        .collect())
}

/// `XCLAIM key group to min_idle ids.. [IDLE ms] [JUSTID]`; entries (deleted
/// ones are dropped from the PEL by Redis 7, or come back with nil fields).
async fn xclaim(
    shared: &Shared,
    key: &str,
    to: &str,
    min_idle_ms: u64,
    ids: &[String],
    idle_ms: Option<u64>,
    just_id: bool,
) -> Result<Vec<crate::event::RawEntry>, Error> {
    let mut args = vec![
        key.to_string(),
        shared.group.clone(),
        to.to_string(),
        min_idle_ms.to_string(),
    ];
    args.extend(ids.iter().cloned());
    if let Some(idle) = idle_ms {
        args.push("IDLE".into());
        args.push(idle.to_string());
    }
    if just_id {
        args.push("JUSTID".into());
    }
    let reply: Value = shared.client.custom(fred::cmd!("XCLAIM"), args).await?;
    Ok(if just_id {
        Vec::new()
    } else {
        parse_entries(reply)
    })
}

/// Rows of an extended `XPENDING` reply: (id, owner).
fn pending_rows(reply: Value) -> Vec<(String, String)> {
    reply
        .into_array()
        .into_iter()
        .filter_map(|row| {
            let mut row = row.into_array().into_iter();
            let id = row.next()?.as_string()?;
            let owner = row.next()?.as_string()?;
            Some((id, owner))
        })
        .collect()
}

/// `XINFO CONSUMERS`: (name, idle ms) per consumer.
async fn consumers(shared: &Shared, key: &str) -> Result<Vec<(String, u64)>, Error> {
    let reply: Result<Value, _> = shared
        .client
        .xinfo_consumers(key, shared.group.as_str())
        .await;
    let reply = match reply {
        Ok(r) => r,
        Err(e) if e.details().starts_with("NOGROUP") || e.details().contains("no such key") => {
            return Ok(Vec::new());
        }
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for consumer in reply.into_array() {
        let mut fields = consumer.into_array().into_iter();
        let (mut name, mut idle) = (None, 0);
        while let (Some(k), Some(v)) = (fields.next(), fields.next()) {
            match k.as_str().as_deref() {
                Some("name") => name = v.as_string(),
                Some("idle") => idle = v.as_u64().unwrap_or(0),
                _ => {}
            }
        }
        if let Some(name) = name {
            out.push((name, idle));
        }
    }
    Ok(out)
}

/// Hands this member's pending events to a live member (made claimable at
/// once), deletes its consumers that have no pending entries, and removes
/// it from the members. With no live member the events stay pending for
/// the next member to claim.
pub(crate) async fn leave(shared: &Shared) {
    if let Err(e) = try_leave(shared).await {
        tracing::warn!(sink = %shared.group, member = %shared.member_id, error = %e,
            "leaving the sink cleanly failed; its events stay pending and will be claimed");
    }
}

async fn try_leave(shared: &Shared) -> Result<(), Error> {
    let view = shared.members.view().await?;
    let ttl_ms = shared.options.member_ttl.as_millis() as u64;
    let heir = view
        .members
        .iter()
        .filter(|(m, _)| **m != shared.member_id && view.is_live(m, ttl_ms))
        .max_by_key(|(_, at)| **at)
        .map(|(m, _)| m.clone());
    let grace_ms = shared.options.ack_grace.as_millis() as u64;
    for (name, key) in shared.streams() {
        if let Some(heir) = &heir {
            for _ in 0..MAX_PAGES * 10 {
                let ids = pending_of(shared, &key, &shared.member_id).await?;
                if ids.is_empty() {
                    break;
                }
                xclaim(shared, &key, heir, 0, &ids, Some(grace_ms), true).await?;
                tracing::info!(sink = %shared.group, stream = %name, to = %heir, count = ids.len(), "handed pending events over");
            }
        }
        let _: i64 = DELCONSUMER_IF_EMPTY
            .evalsha_with_reload(
                &shared.client,
                vec![key.clone()],
                vec![shared.group.clone(), shared.member_id.clone()],
            )
            .await?;
    }
    shared.members.remove(&shared.member_id).await
}
