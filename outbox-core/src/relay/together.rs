//! The relay's statements on many shards at once, as a database groups its commits: the
//! claims of the shards the relay starts ([`Store::claim_many`]) and the acknowledgements and
//! releases of the shards whose drain emptied them ([`Store::ack_and_finish_many`]), the
//! replicated models' rows the drains read ([`Store::load_models`]), and the heartbeats of the
//! leases it keeps ([`Store::extend_leases`]), each go to the store one
//! batch at a time (claims: one batch of each lane, so that the shards commits name are never
//! queued behind a sweep's). Nothing waits for a batch to fill: a shard that finds no batch
//! being written writes its own at once, with those whose tasks were ready to run at the same
//! moment (one yield, no timer); those that come meanwhile queue up and go with the next. At a
//! low rate every shard goes at once; at a high one, a batch holds what came during one round
//! trip.

use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tracing::{Instrument, debug, info_span};

use super::slots::Lane;
use crate::columns::ModelRow;
use crate::error::Error;
use crate::hashed::Map;
use crate::id::Id;
use crate::model::ShardKey;
use crate::replicated::ModelTable;
use crate::store::{Acknowledgement, ClaimOptions, Lease, ShardSession, Store};

/// A queue of items that are written in batches, one batch at a time, each answered with its
/// own result.
pub(super) struct Batches<I, R> {
    queue: Mutex<Vec<(I, oneshot::Sender<R>)>>,
    /// Held by the caller writing a batch.
    writing: tokio::sync::Mutex<()>,
}

impl<I, R> Default for Batches<I, R> {
    fn default() -> Self {
        Self {
            queue: Mutex::new(Vec::new()),
            writing: tokio::sync::Mutex::new(()),
        }
    }
}

impl<I, R> Batches<I, R> {
    /// Queues `item`, then waits for its result: written by whichever caller takes the next
    /// turn (this one, if none is writing), with `write`, which answers each item of its
    /// batch in order. `None`: the batch was dropped unwritten (its writer's task aborted at
    /// shutdown) or `write` gave this item no answer.
    pub(super) async fn submit<F, W>(&self, item: I, write: W) -> Option<R>
    where
        W: FnOnce(Vec<I>) -> F,
        F: Future<Output = Vec<R>>,
    {
        let (reply, mut answer) = oneshot::channel();
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((item, reply));
        let writing = tokio::select! {
            biased;
            answered = &mut answer => return answered.ok(),
            writing = self.writing.lock() => writing,
        };
        // The tasks that are ready to run now (the other shards of a claim just answered,
        // their drains ending at once) queue up before this batch is taken: one yield, no
        // timer. Otherwise the first of them would write alone, and the batches would
        // alternate between one item and the rest.
        tokio::task::yield_now().await;
        let batch = std::mem::take(&mut *self.queue.lock().unwrap_or_else(PoisonError::into_inner));
        if !batch.is_empty() {
            let (items, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
            // Boxed: only the writer of a batch holds the store's statement, so that every
            // caller's future (and the drain holding it) stays small.
            let results = Box::pin(write(items)).await;
            for (reply, result) in replies.into_iter().zip(results) {
                // A caller that stopped waiting (its task aborted at shutdown) needs no answer.
                let _ = reply.send(result);
            }
        }
        drop(writing);
        // This item went in this batch, or in one written before it took the turn.
        answer.await.ok()
    }
}

/// What a drained shard's finish did: the rows it deleted, and whether the lease was still
/// held at the release (as [`ShardSession::ack_and_finish`]
/// returns it).
pub(super) type Finished = Result<(u64, bool), Error>;

/// Drained shards to finish: each one's session, and the acknowledgements of what got through.
pub(super) type Finishing<S> = Vec<(<S as Store>::Session, Vec<Acknowledgement>)>;

/// A claim of one shard: its session, or `None` when another worker holds it (or it has
/// nothing due).
pub(super) type Claimed<S> = Result<Option<<S as Store>::Session>, Error>;

/// The rows of a replicated model's objects, one answer per key (`None`: no such row), or
/// nothing if the store did not read them so.
pub(super) type Loaded = Option<Vec<Option<ModelRow>>>;

/// The shards being claimed and finished together, and the models' rows their deliveries
/// read together.
pub(super) struct Together<S: Store> {
    /// The claims of shards a sweep found (or drained again).
    claims: Batches<Vec<ShardKey>, Vec<Claimed<S>>>,
    /// The claims of shards commits named: written beside a sweep's, never queued behind
    /// one, so that live messages do not wait for a backlog's (or a backfill's) large claims.
    urgent_claims: Batches<Vec<ShardKey>, Vec<Claimed<S>>>,
    /// The drained shards finishing: each item the shards one task emptied at once.
    finishes: Batches<Finishing<S>, Vec<Finished>>,
    loads: Batches<(ModelTable, Vec<Id>), Loaded>,
    /// The heartbeats of the leases the relay keeps: one statement for all those due at
    /// once, so that a relay holding many shards asks for SQLite's write lock once a
    /// heartbeat, not once a shard.
    extensions: Batches<Lease, Result<bool, Error>>,
}

impl<S: Store> Default for Together<S> {
    fn default() -> Self {
        Self {
            claims: Batches::default(),
            urgent_claims: Batches::default(),
            finishes: Batches::default(),
            loads: Batches::default(),
            extensions: Batches::default(),
        }
    }
}

impl<S: Store> Together<S> {
    /// Claims `shards` (one claim's batch) with the other shards of its lane being started
    /// now, reading up to `limit` of each one's heads: one answer per shard, in order. A
    /// failed claim is the error of one of the shards; the others were not claimed.
    pub(super) async fn claim(
        &self,
        store: &S,
        shards: Vec<ShardKey>,
        options: &ClaimOptions,
        limit: usize,
        lane: Lane,
    ) -> Vec<Claimed<S>> {
        let count = shards.len();
        let write = |batches: Vec<Vec<ShardKey>>| async move {
            let mut unique: Vec<ShardKey> = batches.iter().flatten().cloned().collect();
            unique.sort();
            unique.dedup();
            let claimed = store
                .claim_many(&unique, options, limit)
                .instrument(info_span!("outbox.claim_shards", shards = unique.len()))
                .await;
            match claimed {
                Ok(sessions) => {
                    // Each session in the place of its shard among the (sorted) shards asked
                    // for, with no map of large sessions built and taken apart again.
                    let mut placed: Vec<Option<S::Session>> =
                        std::iter::repeat_with(|| None).take(unique.len()).collect();
                    let mut after = 0;
                    for session in sessions {
                        if let Some(at) = place(&unique, &mut after, &session.lease().shard) {
                            placed[at] = Some(session);
                        }
                    }
                    // A shard queued twice (by the relay and a flush) is claimed once: the
                    // first to ask drains it, as if the other had found it held.
                    batches
                        .iter()
                        .map(|shards| {
                            let mut after = 0;
                            shards
                                .iter()
                                .map(|shard| {
                                    Ok(place(&unique, &mut after, shard)
                                        .and_then(|at| placed[at].take()))
                                })
                                .collect()
                        })
                        .collect()
                }
                // One shard reports the error (its drain fails, and the relay sweeps and
                // retries); the others were not claimed.
                Err(error) => {
                    let mut error = Some(error);
                    batches
                        .iter()
                        .map(|shards| unclaimed::<S>(shards.len(), error.take()))
                        .collect()
                }
            }
        };
        let claims = match lane {
            Lane::Urgent => &self.urgent_claims,
            Lane::Routine => &self.claims,
        };
        claims
            .submit(shards, write)
            .await
            .unwrap_or_else(|| unclaimed::<S>(count, Some(abandoned("claim"))))
    }

    /// Reads the rows of `table` whose keys are `keys` with those the other drains read now:
    /// one statement per table for the whole batch ([`Store::load_models`]). `None` if the
    /// store did not read them so, or failed to (each delivery then reads its own row, and
    /// reports what fails).
    pub(super) async fn load(&self, store: &S, table: ModelTable, keys: Vec<Id>) -> Loaded {
        let write = |items: Vec<(ModelTable, Vec<Id>)>| async move {
            let mut answers: Vec<Loaded> = vec![None; items.len()];
            let mut tables: Vec<ModelTable> = items.iter().map(|(table, _)| *table).collect();
            tables.sort_by_key(|table| table.table);
            tables.dedup();
            for table in tables {
                let mut keys: Vec<Id> = items
                    .iter()
                    .filter(|(of, _)| *of == table)
                    .flat_map(|(_, keys)| keys.iter().copied())
                    .collect();
                keys.sort_unstable();
                keys.dedup();
                let rows = match store
                    .load_models(&table, &keys)
                    .instrument(info_span!(
                        "outbox.load_models",
                        table = table.table,
                        rows = keys.len()
                    ))
                    .await
                {
                    Ok(rows) if rows.len() == keys.len() => rows,
                    Ok(_) => continue,
                    Err(error) => {
                        debug!(table = table.table, error = %crate::error::error_chain(&error), "cannot read models' rows together; each delivery reads its own");
                        continue;
                    }
                };
                let found: Map<Id, Option<ModelRow>> = keys.into_iter().zip(rows).collect();
                for ((of, keys), answer) in items.iter().zip(&mut answers) {
                    if *of == table {
                        *answer = keys.iter().map(|key| found.get(key).cloned()).collect();
                    }
                }
            }
            answers
        };
        self.loads.submit((table, keys), write).await.flatten()
    }

    /// Extends `lease` by `duration` with the other leases being extended now
    /// ([`Store::extend_leases`]): whether it was still held.
    pub(super) async fn extend(
        &self,
        store: &S,
        lease: &Lease,
        duration: Duration,
    ) -> Result<bool, Error> {
        const OPERATION: &str = "extending leases";
        let write = |leases: Vec<Lease>| async move {
            match store
                .extend_leases(&leases, duration)
                .instrument(info_span!("outbox.extend_leases", leases = leases.len()))
                .await
            {
                Ok(held) => (0..leases.len())
                    .map(|at| {
                        held.get(at).copied().ok_or_else(|| Error::Database {
                            operation: OPERATION,
                            source: format!(
                                "the store answered {} of {} leases",
                                held.len(),
                                leases.len()
                            )
                            .into(),
                        })
                    })
                    .collect(),
                Err(error) => error
                    .shared_by(leases.len(), OPERATION)
                    .into_iter()
                    .map(Err)
                    .collect(),
            }
        };
        loop {
            if let Some(held) = self.extensions.submit(lease.clone(), write).await {
                return held;
            }
            // The batch went with its writer, a heartbeat whose handler ended before the
            // store answered: this lease goes in the next one.
        }
    }

    /// Acknowledges each of `finishing`'s rows and releases its session's shard as drained,
    /// with the other shards finishing now: one answer per session, in order (a session whose
    /// batch was abandoned at shutdown, or that the store did not answer, gets an error).
    pub(super) async fn finish(&self, store: &S, finishing: Finishing<S>) -> Vec<Finished> {
        let count = finishing.len();
        let write = |batches: Vec<Finishing<S>>| async move {
            let counts: Vec<usize> = batches.iter().map(Vec::len).collect();
            // Gathered with room for all at once: a session is large, and a vector that grows
            // moves every one of them again.
            let mut all = Vec::with_capacity(counts.iter().sum());
            for batch in batches {
                all.extend(batch);
            }
            let mut finished = store.ack_and_finish_many(all).await.into_iter();
            counts
                .into_iter()
                .map(|count| finished.by_ref().take(count).collect())
                .collect()
        };
        let mut finished = self
            .finishes
            .submit(finishing, write)
            .await
            .unwrap_or_default();
        finished.resize_with(count, || Err(abandoned("acknowledge")));
        finished
    }

    /// [`Together::finish`] of one session.
    pub(super) async fn finish_one(
        &self,
        store: &S,
        session: S::Session,
        acks: Vec<Acknowledgement>,
    ) -> Finished {
        self.finish(store, vec![(session, acks)])
            .await
            .pop()
            .unwrap_or_else(|| Err(abandoned("acknowledge")))
    }
}

/// The place of `shard` in `sorted`, looked for from `after` (where the last one was found, moved
/// on to after this one): keys asked for in order, or claimed in order (a claim draws its tokens
/// in key order), are each found a step or a few on, and the others by a search.
fn place(sorted: &[ShardKey], after: &mut usize, shard: &ShardKey) -> Option<usize> {
    /// How far on a key is looked for before it is searched for.
    const NEAR: usize = 8;
    let behind = *after > 0 && sorted.get(*after - 1).is_some_and(|key| key >= shard);
    let near = sorted.get(*after..).unwrap_or_default();
    let step = near.iter().take(NEAR).position(|key| key >= shard);
    let found = match step {
        Some(step) if !behind => (near[step] == *shard).then_some(*after + step),
        _ => sorted.binary_search(shard).ok(),
    };
    if let Some(at) = found {
        *after = at + 1;
    }
    found
}

/// The answers to a claim of `count` shards that claimed none of them: the first reports
/// `error`, if any, and the others were not claimed.
fn unclaimed<S: Store>(count: usize, mut error: Option<Error>) -> Vec<Claimed<S>> {
    (0..count)
        .map(|_| error.take().map_or(Ok(None), Err))
        .collect()
}

/// The error of a shard whose batch was dropped unwritten (its writer's task aborted at
/// shutdown): as a drain the database interrupted, its lease (if any) is released later.
fn abandoned(what: &str) -> Error {
    Error::Unavailable {
        source: format!("the batch that was to {what} this shard was abandoned").into(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn keys_are_placed_in_order_out_of_order_and_absent() {
        use crate::model::ScopeId;
        let key = |n: i64| ShardKey::local(ScopeId(1), n);
        let sorted: Vec<ShardKey> = (0..40).map(|n| key(n * 2)).collect();
        let mut after = 0;
        // In order, near and far.
        assert_eq!(place(&sorted, &mut after, &key(2)), Some(1));
        assert_eq!(place(&sorted, &mut after, &key(4)), Some(2));
        assert_eq!(place(&sorted, &mut after, &key(60)), Some(30));
        // Absent: between two keys, near and far, and beyond the last.
        assert_eq!(place(&sorted, &mut after, &key(61)), None);
        assert_eq!(place(&sorted, &mut after, &key(63)), None);
        assert_eq!(place(&sorted, &mut after, &key(1)), None);
        assert_eq!(place(&sorted, &mut after, &key(99)), None);
        // Behind the last found (a second run of keys), and the same key again.
        assert_eq!(place(&sorted, &mut after, &key(0)), Some(0));
        assert_eq!(place(&sorted, &mut after, &key(0)), Some(0));
        assert_eq!(place(&sorted, &mut after, &key(78)), Some(39));
        assert_eq!(place(&sorted, &mut after, &key(78)), Some(39));
        assert_eq!(place(&[], &mut 0, &key(1)), None);
        // Every key of a shuffled order is found where it is.
        let mut after = 0;
        for n in [5, 3, 9, 10, 11, 0, 39, 38, 1] {
            assert_eq!(place(&sorted, &mut after, &key(n * 2)), Some(n as usize));
        }
    }

    #[tokio::test]
    async fn what_queues_while_a_batch_is_written_goes_in_the_next_one() {
        let batches: Arc<Batches<u32, u32>> = Arc::default();
        let written: Arc<Mutex<Vec<Vec<u32>>>> = Arc::default();
        let (entered, mut wait_entered) = tokio::sync::mpsc::unbounded_channel();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let writer = |batches: &Arc<Batches<u32, u32>>, item: u32| {
            let (batches, written, entered, gate) = (
                Arc::clone(batches),
                Arc::clone(&written),
                entered.clone(),
                Arc::clone(&gate),
            );
            tokio::spawn(async move {
                batches
                    .submit(item, |items: Vec<u32>| async move {
                        let _ = entered.send(());
                        gate.acquire().await.expect("open").forget();
                        written
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(items.clone());
                        items.iter().map(|item| item * 10).collect()
                    })
                    .await
            })
        };
        // The first goes alone, at once.
        let first = writer(&batches, 1);
        wait_entered
            .recv()
            .await
            .expect("the first batch is being written");
        // These queue behind it.
        let queued: Vec<_> = (2..=4).map(|item| writer(&batches, item)).collect();
        while batches
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
            < 3
        {
            tokio::task::yield_now().await;
        }
        gate.add_permits(2);
        assert_eq!(first.await.expect("first"), Some(10));
        let mut answers = Vec::new();
        for task in queued {
            answers.push(task.await.expect("queued"));
        }
        assert_eq!(answers, [Some(20), Some(30), Some(40)]);
        assert_eq!(
            *written.lock().unwrap_or_else(PoisonError::into_inner),
            [vec![1], vec![2, 3, 4]],
            "one batch alone, then one batch of everything that queued meanwhile"
        );
    }

    /// Shards whose tasks are ready together (the drains of one claim, ending at once) go in
    /// one batch: the first of them does not write alone.
    #[tokio::test]
    async fn items_submitted_by_tasks_ready_together_go_in_one_batch() {
        let batches: Arc<Batches<u32, u32>> = Arc::default();
        let written: Arc<Mutex<Vec<Vec<u32>>>> = Arc::default();
        let tasks: Vec<_> = (1..=5)
            .map(|item| {
                let (batches, written) = (Arc::clone(&batches), Arc::clone(&written));
                tokio::spawn(async move {
                    batches
                        .submit(item, |items: Vec<u32>| async move {
                            written
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .push(items.clone());
                            items
                        })
                        .await
                })
            })
            .collect();
        for (task, item) in tasks.into_iter().zip(1..) {
            assert_eq!(task.await.expect("task"), Some(item));
        }
        assert_eq!(
            *written.lock().unwrap_or_else(PoisonError::into_inner),
            [vec![1, 2, 3, 4, 5]]
        );
    }

    #[tokio::test]
    async fn an_item_the_writer_does_not_answer_gets_none() {
        let batches: Batches<u32, u32> = Batches::default();
        let answer = batches
            .submit(7, |_items: Vec<u32>| async { Vec::new() })
            .await;
        assert_eq!(answer, None);
    }
}
