//! Change notifications: [`Map::subscribe`](crate::Map::subscribe).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures::Stream;
use tokio::sync::mpsc;

/// What happened to the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MapEventKind {
    /// A key was set (created or changed).
    Set,
    /// A key was deleted.
    Delete,
    /// Every key was deleted ([`Map::reset`](crate::Map::reset) or
    /// [`Map::destroy`](crate::Map::destroy)).
    Reset,
    /// The replica reloaded its content from Redis (after a reconnect, a
    /// missed message, or because this subscriber was too slow and events
    /// were dropped): re-read whatever you derive from the map.
    Resynced,
}

/// One change notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapEvent {
    /// What happened.
    pub kind: MapEventKind,
    /// The key, for [`Set`](MapEventKind::Set) and
    /// [`Delete`](MapEventKind::Delete); `None` otherwise.
    pub key: Option<String>,
}

/// A stream of [`MapEvent`]s from [`Map::subscribe`](crate::Map::subscribe).
///
/// Events are delivered after the replica applied them, so the map already
/// shows the change. The stream buffers
/// [`event_buffer`](crate::MapOptions::event_buffer) events; when a slow
/// reader lets it fill up, further events are dropped and the stream yields
/// one [`Resynced`](MapEventKind::Resynced) once the reader has caught up.
/// The stream ends when the map is closed.
#[derive(Debug)]
pub struct MapEvents {
    rx: mpsc::Receiver<MapEvent>,
    dropped: Arc<AtomicBool>,
}

/// The map's end of one [`MapEvents`].
#[derive(Debug)]
pub(crate) struct EventSender {
    tx: mpsc::Sender<MapEvent>,
    dropped: Arc<AtomicBool>,
}

pub(crate) fn channel(buffer: usize) -> (EventSender, MapEvents) {
    let (tx, rx) = mpsc::channel(buffer.max(1));
    let dropped = Arc::new(AtomicBool::new(false));
    (
        EventSender {
            tx,
            dropped: dropped.clone(),
        },
        MapEvents { rx, dropped },
    )
}

impl EventSender {
    /// Delivers an event without waiting; returns `false` when the stream is
    /// gone (the sender should be dropped).
    pub(crate) fn send(&self, event: &MapEvent) -> bool {
        match self.tx.try_send(event.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.dropped.store(true, Ordering::Release);
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }
}

impl Stream for MapEvents {
    type Item = MapEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<MapEvent>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(event)) => Poll::Ready(Some(event)),
            // Drained (or closed): report the events dropped meanwhile as one
            // coalesced resync. The flag is only set while the buffer is
            // full, so a reader parked here is never owed a wake-up.
            other => {
                if self.dropped.swap(false, Ordering::AcqRel) {
                    Poll::Ready(Some(MapEvent {
                        kind: MapEventKind::Resynced,
                        key: None,
                    }))
                } else {
                    other
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    fn set(key: &str) -> MapEvent {
        MapEvent {
            kind: MapEventKind::Set,
            key: Some(key.to_string()),
        }
    }

    #[tokio::test]
    async fn overflow_is_coalesced_into_one_resync() {
        let (tx, mut rx) = channel(2);
        for k in ["a", "b", "c", "d"] {
            assert!(tx.send(&set(k)));
        }
        assert_eq!(rx.next().await, Some(set("a")));
        assert_eq!(rx.next().await, Some(set("b")));
        assert_eq!(
            rx.next().await.map(|e| e.kind),
            Some(MapEventKind::Resynced)
        );
        assert!(tx.send(&set("e")));
        assert_eq!(rx.next().await, Some(set("e")));
        drop(tx);
        assert_eq!(rx.next().await, None);
    }
}
