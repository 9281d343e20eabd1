//! Subscriber channels shared by readers (every subscriber gets every
//! event) and sinks (each event to one subscriber).

use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tokio::sync::{mpsc, watch};

use crate::Event;

/// The live subscribers of a reader or sink.
#[derive(Debug)]
pub(crate) struct Subscribers {
    senders: Mutex<Vec<mpsc::Sender<Event>>>,
    added: watch::Sender<u64>,
    next: AtomicUsize,
    buffer: usize,
    closed: AtomicBool,
}

impl Subscribers {
    pub(crate) fn new(buffer: usize) -> Self {
        Subscribers {
            senders: Mutex::new(Vec::new()),
            added: watch::Sender::new(0),
            next: AtomicUsize::new(0),
            buffer,
            closed: AtomicBool::new(false),
        }
    }

    /// A new subscriber channel.
    pub(crate) fn subscribe(&self) -> mpsc::Receiver<Event> {
        let (tx, rx) = mpsc::channel(self.buffer);
        let mut senders = lock(&self.senders);
        if !self.closed.load(Ordering::Acquire) {
            senders.push(tx);
        }
        drop(senders);
        self.added.send_modify(|n| *n += 1);
        rx
    }

    fn live(&self) -> Vec<mpsc::Sender<Event>> {
        let mut senders = lock(&self.senders);
        senders.retain(|s| !s.is_closed());
        senders.clone()
    }

    /// Waits until at least one subscriber is alive.
    pub(crate) async fn wait_any(&self) {
        let mut rx = self.added.subscribe();
        loop {
            if !self.live().is_empty() {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Sends to every live subscriber, waiting for room (backpressure).
    /// Returns `false` when there was no live subscriber.
    pub(crate) async fn broadcast(&self, event: Event) -> bool {
        let senders = self.live();
        let Some((last, rest)) = senders.split_last() else {
            return false;
        };
        let mut delivered = false;
        for s in rest {
            delivered |= s.send(event.clone()).await.is_ok();
        }
        delivered | last.send(event).await.is_ok()
    }

    /// Sends to one live subscriber (round robin), waiting for room.
    /// Gives the event back when there is no live subscriber.
    pub(crate) async fn send_one(&self, mut event: Event) -> Result<(), Event> {
        loop {
            let senders = self.live();
            if senders.is_empty() {
                return Err(event);
            }
            let i = self.next.fetch_add(1, Ordering::Relaxed) % senders.len();
            match senders[i].send(event).await {
                Ok(()) => return Ok(()),
                Err(mpsc::error::SendError(e)) => event = e,
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Receiving end shared by [`ReaderEvents`](crate::ReaderEvents) and
/// [`SinkEvents`](crate::SinkEvents).
#[derive(Debug)]
pub(crate) struct Receiver {
    pub(crate) rx: mpsc::Receiver<Event>,
}

impl futures::Stream for Receiver {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.rx.poll_recv(cx)
    }
}

impl Subscribers {
    /// Drops every subscriber's sender (their streams end) and refuses new
    /// ones: a subscriber created afterwards ends at once.
    pub(crate) fn close(&self) {
        let mut senders = lock(&self.senders);
        senders.clear();
        self.closed.store(true, Ordering::Release);
    }
}
