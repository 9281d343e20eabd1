//! Batching of script calls: callers queue items and wait for their own
//! answer; one task drains the queue and makes one call for every item
//! queued while its previous calls were in flight (two at most at a time).
//! Alone, an item goes out at once (no added wait); under load, one call
//! serves many.
//!
//! ```text
//! caller ──item──▶ queue ──▶ batch task ──one script call (N items)──▶ Redis
//!   ▲                              │
//!   └──────── answer per item ◀────┘
//! ```

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};

/// `items` cut, in order, into batches of at most `max_items` and, but for
/// an item alone, at most `max_bytes` by `size`: for calls that carry
/// payloads, which Redis reads whole before it runs them.
pub(crate) fn bounded<T>(
    items: Vec<T>,
    max_items: usize,
    max_bytes: usize,
    size: impl Fn(&T) -> usize,
) -> Vec<Vec<T>> {
    let mut batches = Vec::with_capacity(items.len().div_ceil(max_items.max(1)));
    let mut batch: Vec<T> = Vec::new();
    let mut bytes = 0;
    for item in items {
        let item_bytes = size(&item);
        if !batch.is_empty() && (batch.len() >= max_items || bytes + item_bytes > max_bytes) {
            batches.push(std::mem::take(&mut batch));
            bytes = 0;
        }
        bytes += item_bytes;
        batch.push(item);
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

/// Items queued before callers wait (backpressure).
const QUEUE: usize = 1024;

struct Queued<T, R> {
    item: T,
    done: oneshot::Sender<Result<R>>,
}

/// The callers' side of a batch queue.
pub(crate) struct Batcher<T, R> {
    queue: mpsc::Sender<Queued<T, R>>,
}

impl<T, R> std::fmt::Debug for Batcher<T, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("queued", &(QUEUE - self.queue.capacity()))
            .finish()
    }
}

/// The task's side of a batch queue (see [`BatchQueue::run`]).
pub(crate) struct BatchQueue<T, R>(mpsc::Receiver<Queued<T, R>>);

impl<T, R> Batcher<T, R> {
    /// A batcher and the queue its task drains.
    pub(crate) fn new() -> (Batcher<T, R>, BatchQueue<T, R>) {
        let (queue, rx) = mpsc::channel(QUEUE);
        (Batcher { queue }, BatchQueue(rx))
    }

    /// Queues `item` and waits for its answer.
    ///
    /// # Errors
    /// [`Error::Closed`] when the task ended first; the call's error (the
    /// outcome is then unknown: the script may have run).
    pub(crate) async fn submit(&self, item: T) -> Result<R> {
        let (done, answer) = oneshot::channel();
        self.queue
            .send(Queued { item, done })
            .await
            .map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }
}

impl<T, R> BatchQueue<T, R> {
    /// Makes one `call` per batch of at most `max` items, with up to
    /// [`IN_FLIGHT`] calls at a time, until `cancel` fires or every batcher
    /// is gone. `call` answers each item of its batch in order; its error is
    /// every item's error. Items still queued at the end get
    /// [`Error::Closed`] (their senders are dropped). Batch sizes go to
    /// `sizes`.
    pub(crate) async fn run(
        self,
        what: &'static str,
        sizes: metrics::Histogram,
        cancel: &CancellationToken,
        max: usize,
        call: impl for<'a> Fn(&'a [T]) -> BoxFuture<'a, Result<Vec<R>>>,
    ) {
        let mut queue = self.0;
        let call = &call;
        let mut in_flight = FuturesUnordered::new();
        loop {
            let first = tokio::select! {
                _ = cancel.cancelled() => return,
                Some(()) = in_flight.next(), if !in_flight.is_empty() => continue,
                q = queue.recv(), if in_flight.len() < IN_FLIGHT => match q {
                    Some(q) => q,
                    None => break,
                },
            };
            let mut items = Vec::with_capacity(max.min(16));
            let mut waiting = Vec::with_capacity(max.min(16));
            let mut next = Some(first);
            while let Some(Queued { item, done }) = next.take() {
                items.push(item);
                waiting.push(done);
                if items.len() < max {
                    next = queue.try_recv().ok();
                }
            }
            sizes.record(items.len() as f64);
            in_flight.push(async move {
                let result = call(&items).await;
                answer(what, waiting, items.len(), result);
            });
        }
        // Every batcher is gone: finish the calls already made.
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = async { while in_flight.next().await.is_some() {} } => {}
        }
    }
}

/// Calls of one batch queue in flight at a time: the next batch is
/// collected and sent while the previous one is still in Redis.
const IN_FLIGHT: usize = 2;

/// Sends each item of a batch its answer (or the batch's error).
fn answer<R>(
    what: &'static str,
    waiting: Vec<oneshot::Sender<Result<R>>>,
    count: usize,
    result: Result<Vec<R>>,
) {
    match result {
        Ok(answers) if answers.len() == count => {
            for (done, answer) in waiting.into_iter().zip(answers) {
                let _ = done.send(Ok(answer));
            }
        }
        Ok(answers) => {
            let reason = format!("{} answers for {count} items", answers.len());
            for done in waiting {
                let _ = done.send(Err(Error::Malformed {
                    what,
                    reason: reason.clone(),
                }));
            }
        }
        Err(e) => {
            for done in waiting {
                let _ = done.send(Err(copy_error(&e, what)));
            }
        }
    }
}

/// One item's copy of its batch's error, still matchable: connection
/// trouble stays [`Error::Unavailable`], writes refused stay
/// [`Error::WritesRefused`], a Redis error stays [`Error::Redis`].
fn copy_error(e: &Error, what: &'static str) -> Error {
    match e {
        Error::Unavailable(inner) => Error::Unavailable(inner.clone()),
        Error::Redis(inner) => Error::Redis(inner.clone()),
        Error::WritesRefused(inner) => Error::WritesRefused(inner.clone()),
        Error::Closed => Error::Closed,
        Error::Timeout(d) => Error::Timeout(*d),
        other => Error::Malformed {
            what,
            reason: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lens<T>(batches: &[Vec<T>]) -> Vec<usize> {
        batches.iter().map(Vec::len).collect()
    }

    #[test]
    fn small_items_go_by_the_batch_count() {
        let items: Vec<usize> = vec![100; 150];
        assert_eq!(lens(&bounded(items, 64, 1 << 20, |n| *n)), [64, 64, 22]);
        assert!(bounded(Vec::<usize>::new(), 64, 1 << 20, |n| *n).is_empty());
    }

    #[test]
    fn large_items_make_smaller_batches_and_a_huge_one_goes_alone() {
        let max = 1 << 20;
        // Ten items of a quarter of the bound and a bit, a huge one among them.
        let mut items: Vec<(usize, usize)> = (0..10).map(|i| (i, max / 4 + 2)).collect();
        items.insert(5, (99, 3 * max));
        let cut = bounded(items, 64, max, |(_, n)| *n);
        assert_eq!(lens(&cut), [3, 2, 1, 3, 2]);
        assert_eq!(cut[2], [(99, 3 * max)]);
        let order: Vec<usize> = cut.iter().flatten().map(|(i, _)| *i).collect();
        assert_eq!(
            order,
            [0, 1, 2, 3, 4, 99, 5, 6, 7, 8, 9],
            "every item once, in order"
        );
    }

    /// Items queued while a call is in flight go out together, each gets
    /// its own answer, and a failed call fails each of its items.
    #[tokio::test]
    async fn queued_items_share_a_call_and_get_their_own_answers() {
        let (batcher, queue) = Batcher::<u32, u32>::new();
        let cancel = CancellationToken::new();
        let (sizes_tx, mut sizes) = mpsc::unbounded_channel();
        let task = {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                queue
                    .run(
                        "test",
                        metrics::Histogram::noop(),
                        &cancel,
                        8,
                        |items: &[u32]| {
                            let sizes_tx = sizes_tx.clone();
                            Box::pin(async move {
                                sizes_tx.send(items.len()).unwrap();
                                // Hold the call so the rest queue up behind it.
                                tokio::task::yield_now().await;
                                if items.contains(&13) {
                                    return Err(Error::Closed);
                                }
                                Ok(items.iter().map(|i| i * 10).collect())
                            })
                        },
                    )
                    .await
            })
        };
        let batcher = std::sync::Arc::new(batcher);
        let calls: Vec<_> = (0..20u32)
            .map(|i| {
                let b = batcher.clone();
                tokio::spawn(async move { (i, b.submit(i).await) })
            })
            .collect();
        for call in calls {
            let (i, answer) = call.await.unwrap();
            match answer {
                Ok(v) => assert_eq!(v, i * 10),
                Err(Error::Closed) => {}
                Err(e) => panic!("unexpected error for {i}: {e}"),
            }
        }
        drop(batcher);
        task.await.unwrap();
        let mut total = 0;
        let mut largest = 0;
        while let Ok(n) = sizes.try_recv() {
            assert!(n <= 8, "batch of {n} over the maximum");
            total += n;
            largest = largest.max(n);
        }
        assert_eq!(total, 20, "every item went out once");
        assert!(largest > 1, "no two items shared a call");
        cancel.cancel();
    }
}
