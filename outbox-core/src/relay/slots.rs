//! The relay's handler slots (`max_concurrent_shards`), taken in two lanes: the shards a
//! commit named take their turns before those a sweep found.
//!
//! A relay holds many more shards than it runs handlers for (a claim's batch), and a sweep of a
//! large backlog (a backfill's, a burst's) fills that batch. A message committed meanwhile, on
//! a shard of its own, would wait for its turn behind the whole batch: its shard is claimed
//! from the commit's wake-up as urgent instead, and the next free slot is its. A commit on a
//! shard the sweep's batch holds already promotes that shard: its waiting turn moves to the
//! urgent lane, and so do its later turns.

use std::collections::VecDeque;

use std::sync::{Mutex, PoisonError};

use tokio::sync::oneshot;

use crate::hashed::Set;
use crate::model::ShardKey;

/// Which queue a shard waits in for its handler's turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// A shard a commit named (live traffic): served first.
    Urgent,
    /// A shard a sweep found (a backlog, a retry that came due): served when no urgent shard
    /// waits.
    Routine,
}

/// A counting semaphore whose waiters are served urgent first, then in arrival order.
#[derive(Debug)]
pub(super) struct Slots {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    free: usize,
    urgent: VecDeque<Waiter>,
    routine: VecDeque<Waiter>,
    /// The shards whose turns are urgent whatever lane their drain began in.
    promoted: Set<ShardKey>,
}

/// A shard waiting for its turn.
#[derive(Debug)]
struct Waiter {
    shard: ShardKey,
    turn: oneshot::Sender<()>,
}

/// One slot, given back when dropped: to the first waiter, urgent first.
#[derive(Debug)]
pub(super) struct Slot<'a>(&'a Slots);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl Slots {
    pub(super) fn new(slots: usize) -> Self {
        Self {
            state: Mutex::new(State {
                free: slots,
                urgent: VecDeque::new(),
                routine: VecDeque::new(),
                promoted: Set::default(),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot, if one is free now.
    pub(super) fn try_acquire(&self) -> Option<Slot<'_>> {
        let mut state = self.state();
        if state.free == 0 {
            return None;
        }
        state.free -= 1;
        Some(Slot(self))
    }

    /// Waits for a slot for `shard`, in `lane` (urgent, if the shard was promoted). Cancel-safe:
    /// a waiter dropped after it was handed a slot hands it on.
    pub(super) async fn acquire(&self, lane: Lane, shard: &ShardKey) -> Slot<'_> {
        let receiver = {
            let mut state = self.state();
            if state.free > 0 {
                state.free -= 1;
                return Slot(self);
            }
            let (turn, receiver) = oneshot::channel();
            let waiter = Waiter {
                shard: shard.clone(),
                turn,
            };
            if lane == Lane::Urgent || state.promoted.contains(shard) {
                state.urgent.push_back(waiter);
            } else {
                state.routine.push_back(waiter);
            }
            receiver
        };
        let mut waiting = Waiting {
            slots: self,
            receiver: Some(receiver),
        };
        if let Some(receiver) = &mut waiting.receiver {
            // The sender is only dropped once it has sent (release) or with the whole
            // `Slots`, which outlives this borrow.
            let _ = receiver.await;
        }
        waiting.receiver = None;
        Slot(self)
    }

    /// Makes `shard`'s turns urgent until [`Slots::forget`]: a turn it waits for now moves to
    /// the back of the urgent lane, and those it asks for later go there. Whether a turn was
    /// waiting.
    pub(super) fn promote(&self, shard: &ShardKey) -> bool {
        let mut state = self.state();
        state.promoted.insert(shard.clone());
        let Some(at) = state
            .routine
            .iter()
            .position(|waiter| waiter.shard == *shard)
        else {
            return false;
        };
        let waiter = state.routine.remove(at).expect("a position in the queue");
        state.urgent.push_back(waiter);
        true
    }

    /// `shard`'s drain ended: its next drain's turns take the lane it is started in.
    pub(super) fn forget(&self, shard: &ShardKey) {
        self.state().promoted.remove(shard);
    }

    fn release(&self) {
        let mut state = self.state();
        loop {
            let next = match state.urgent.pop_front() {
                Some(next) => next,
                None => match state.routine.pop_front() {
                    Some(next) => next,
                    None => {
                        state.free += 1;
                        return;
                    }
                },
            };
            // A waiter that stopped waiting is passed over.
            if next.turn.send(()).is_ok() {
                return;
            }
        }
    }
}

/// A waiter in a queue: if dropped after a slot was sent to it, it gives the slot back.
struct Waiting<'a> {
    slots: &'a Slots,
    receiver: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(mut receiver) = self.receiver.take() {
            receiver.close();
            if receiver.try_recv().is_ok() {
                self.slots.release();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures_util::FutureExt;

    use super::*;

    fn shard(id: i64) -> ShardKey {
        ShardKey::local(crate::ScopeId(1), id)
    }

    type Order = Arc<Mutex<Vec<&'static str>>>;

    /// Queues a waiter for `shard`'s turn in `lane`, which records `name` in `order` when its
    /// turn comes; returns once it waits.
    async fn queue(
        slots: &Arc<Slots>,
        order: &Order,
        (name, lane, id): (&'static str, Lane, i64),
    ) -> tokio::task::JoinHandle<()> {
        let queued = {
            let state = slots.state();
            state.urgent.len() + state.routine.len()
        };
        let (waiter, order) = (Arc::clone(slots), Arc::clone(order));
        let task = tokio::spawn(async move {
            let _slot = waiter.acquire(lane, &shard(id)).await;
            order
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(name);
        });
        while {
            let state = slots.state();
            state.urgent.len() + state.routine.len()
        } == queued
        {
            tokio::task::yield_now().await;
        }
        task
    }

    /// Lets the `held` slot go, and waits for every queued task: the order they were served.
    async fn served(
        held: Slot<'_>,
        tasks: Vec<tokio::task::JoinHandle<()>>,
        order: &Order,
    ) -> Vec<&'static str> {
        drop(held);
        for task in tasks {
            task.await.expect("waiter");
        }
        order.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    #[tokio::test]
    async fn urgent_waiters_are_served_before_routine_ones_each_in_arrival_order() {
        let slots = Arc::new(Slots::new(1));
        let held = slots.try_acquire().expect("one free slot");
        assert!(slots.try_acquire().is_none());
        let order = Order::default();
        let mut tasks = Vec::new();
        for waiter in [
            ("routine 1", Lane::Routine, 1),
            ("routine 2", Lane::Routine, 2),
            ("urgent 1", Lane::Urgent, 3),
            ("urgent 2", Lane::Urgent, 4),
        ] {
            tasks.push(queue(&slots, &order, waiter).await);
        }
        assert_eq!(
            served(held, tasks, &order).await,
            ["urgent 1", "urgent 2", "routine 1", "routine 2"]
        );
        assert!(slots.try_acquire().is_some(), "the slot is free again");
    }

    #[tokio::test]
    async fn a_promoted_shard_takes_its_turns_in_the_urgent_lane_until_forgotten() {
        let slots = Arc::new(Slots::new(1));
        let held = slots.try_acquire().expect("one free slot");
        let order = Order::default();
        let mut tasks = Vec::new();
        for waiter in [
            ("routine 1", Lane::Routine, 1),
            ("routine 2", Lane::Routine, 2),
            ("urgent 3", Lane::Urgent, 3),
        ] {
            tasks.push(queue(&slots, &order, waiter).await);
        }
        assert!(slots.promote(&shard(2)), "shard 2's turn waits");
        assert!(!slots.promote(&shard(4)), "no turn of shard 4 waits");
        // Shard 4's next turn is urgent, though its drain began routine; shard 5's is not.
        tasks.push(queue(&slots, &order, ("routine 5", Lane::Routine, 5)).await);
        tasks.push(queue(&slots, &order, ("promoted 4", Lane::Routine, 4)).await);
        slots.forget(&shard(4));
        tasks.push(queue(&slots, &order, ("forgotten 4", Lane::Routine, 4)).await);
        assert_eq!(
            served(held, tasks, &order).await,
            [
                "urgent 3",
                "routine 2",
                "promoted 4",
                "routine 1",
                "routine 5",
                "forgotten 4"
            ]
        );
    }

    #[tokio::test]
    async fn a_waiter_that_stops_waiting_loses_no_slot() {
        let slots = Slots::new(1);
        let held = slots.try_acquire().expect("free");
        // Dropped while queued: passed over.
        let shard = ShardKey::local(crate::ScopeId(1), 1);
        let mut gone = Box::pin(slots.acquire(Lane::Urgent, &shard));
        assert!((&mut gone).now_or_never().is_none());
        drop(gone);
        // Handed the slot, then dropped before it looked: the slot goes back.
        let mut handed = Box::pin(slots.acquire(Lane::Routine, &shard));
        assert!((&mut handed).now_or_never().is_none());
        drop(held);
        drop(handed);
        assert!(slots.try_acquire().is_some(), "no slot was lost");
    }
}
