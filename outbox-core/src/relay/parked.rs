//! Shards parked on an open breaker: not claimed again until it closes.

use futures_util::FutureExt;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use crate::handler::BoxFuture;
use crate::hashed::{Map, Set};
use crate::model::ShardKey;
use crate::sink::Breaker;

/// A shard whose delivery found its system unreachable, and the breaker it waits on.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WaitingShard {
    /// The shard: released with no attempt counted, still due.
    pub shard: ShardKey,
    /// The breaker that was open.
    pub breaker: Breaker,
}

/// The shards parked on open breakers.
#[derive(Debug, Default)]
pub(super) struct ParkedShards(Map<ShardKey, Breaker>);

impl ParkedShards {
    /// Parks `shard` until `breaker` closes.
    pub(super) fn park(&mut self, shard: ShardKey, breaker: Breaker) {
        self.0.insert(shard, breaker);
    }

    /// Whether `shard` waits on a breaker that is still open.
    pub(super) fn holds(&self, shard: &ShardKey) -> bool {
        self.0.get(shard).is_some_and(Breaker::is_open)
    }
}

/// The shards parked on open breakers, and a future per breaker that ends when it closes:
/// the background relay's.
#[derive(Default)]
pub(super) struct Parked {
    shards: ParkedShards,
    /// The breakers with a future in `closing`.
    watched: Set<u64>,
    closing: FuturesUnordered<BoxFuture<'static, Breaker>>,
}

impl Parked {
    /// Parks `shard` until `breaker` closes.
    pub(super) fn park(&mut self, shard: ShardKey, breaker: Breaker) {
        if self.watched.insert(breaker.id()) {
            let watched = breaker.clone();
            self.closing.push(Box::pin(async move {
                watched.closed().await;
                watched
            }));
        }
        self.shards.park(shard, breaker);
    }

    /// Whether `shard` waits on a breaker that is still open.
    pub(super) fn holds(&self, shard: &ShardKey) -> bool {
        self.shards.holds(shard)
    }

    /// How many shards are parked.
    pub(super) fn len(&self) -> usize {
        self.shards.0.len()
    }

    /// Whether a breaker is being waited on.
    pub(super) fn is_waiting(&self) -> bool {
        !self.closing.is_empty()
    }

    /// The shards of the next breaker to close, unparked; never, if none is waited on.
    pub(super) async fn next_closed(&mut self) -> Vec<ShardKey> {
        match self.closing.next().await {
            Some(breaker) => self.unpark(&breaker),
            None => std::future::pending().await,
        }
    }

    /// The shards of the breakers closed by now, unparked.
    pub(super) fn closed_now(&mut self) -> Vec<ShardKey> {
        let mut shards = Vec::new();
        while let Some(Some(breaker)) = self.closing.next().now_or_never() {
            shards.extend(self.unpark(&breaker));
        }
        shards
    }

    fn unpark(&mut self, breaker: &Breaker) -> Vec<ShardKey> {
        self.watched.remove(&breaker.id());
        self.shards
            .0
            .extract_if(|_, parked| parked.id() == breaker.id())
            .map(|(shard, _)| shard)
            .collect()
    }
}
