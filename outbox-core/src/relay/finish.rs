//! Finishing drained shards together: the acknowledgement and release of every shard whose
//! drain emptied it while another batch was being written go to the store at once
//! ([`Store::ack_and_finish_many`]: one transaction, one commit), as a database groups its
//! commits. Nothing waits for a batch to fill: a drain that finds no batch being written
//! writes its own at once, alone; those that end meanwhile queue up and go with the next.

use std::sync::{Mutex, PoisonError};

use tokio::sync::oneshot;

use crate::error::Error;
use crate::store::{Acknowledgement, Store};

/// What a drained shard's finish did: the rows it deleted, and whether the lease was still
/// held at the release (as [`ShardSession::ack_and_finish`](crate::store::ShardSession::ack_and_finish)
/// returns it).
pub(super) type Finished = Result<(u64, bool), Error>;

/// One drained shard waiting for its batch.
struct Finishing<S: Store> {
    session: S::Session,
    acks: Vec<Acknowledgement>,
    reply: oneshot::Sender<Finished>,
}

/// The queue of drained shards to finish, and the turn to write a batch.
pub(super) struct Finisher<S: Store> {
    queue: Mutex<Vec<Finishing<S>>>,
    /// Held by the drain writing a batch.
    writing: tokio::sync::Mutex<()>,
}

impl<S: Store> Default for Finisher<S> {
    fn default() -> Self {
        Self {
            queue: Mutex::new(Vec::new()),
            writing: tokio::sync::Mutex::new(()),
        }
    }
}

impl<S: Store> Finisher<S> {
    /// Acknowledges `acks` and releases `session`'s shard as drained, with the other shards
    /// finishing now: queued, then written by whichever drain takes the next turn (this one,
    /// if none is writing).
    pub(super) async fn finish(
        &self,
        store: &S,
        session: S::Session,
        acks: Vec<Acknowledgement>,
    ) -> Finished {
        let (reply, mut answer) = oneshot::channel();
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Finishing {
                session,
                acks,
                reply,
            });
        let writing = tokio::select! {
            biased;
            answered = &mut answer => return answered.unwrap_or_else(|_| Err(abandoned())),
            writing = self.writing.lock() => writing,
        };
        let batch = std::mem::take(&mut *self.queue.lock().unwrap_or_else(PoisonError::into_inner));
        if !batch.is_empty() {
            let (finishing, replies): (Vec<_>, Vec<_>) = batch
                .into_iter()
                .map(|item| ((item.session, item.acks), item.reply))
                .unzip();
            let results = store.ack_and_finish_many(finishing).await;
            for (reply, result) in replies.into_iter().zip(results) {
                // A drain that stopped waiting (its task aborted at shutdown) needs no answer.
                let _ = reply.send(result);
            }
        }
        drop(writing);
        // This drain's shard went in this batch, or in one written before it took the turn.
        answer.await.unwrap_or_else(|_| Err(abandoned()))
    }
}

/// The error of a shard whose batch was dropped unwritten (its writer's task aborted at
/// shutdown): as a drain the database interrupted, its lease is released later.
fn abandoned() -> Error {
    Error::Unavailable {
        source: "the batch that was to acknowledge this shard was abandoned".into(),
    }
}
