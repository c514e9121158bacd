//! The relay's handler slots (`max_concurrent_shards`), taken in two lanes: the shards a
//! commit named take their turns before those a sweep found.
//!
//! A relay holds many more shards than it runs handlers for (a claim's batch), and a sweep of a
//! large backlog (a backfill's, a burst's) fills that batch. A message committed meanwhile, on
//! a shard of its own, would wait for its turn behind the whole batch: its shard is claimed
//! from the commit's wake-up as urgent instead, and the next free slot is its.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use tokio::sync::oneshot;

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
    urgent: VecDeque<oneshot::Sender<()>>,
    routine: VecDeque<oneshot::Sender<()>>,
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

    /// Waits for a slot in `lane`. Cancel-safe: a waiter dropped after it was handed a slot
    /// hands it on.
    pub(super) async fn acquire(&self, lane: Lane) -> Slot<'_> {
        let receiver = {
            let mut state = self.state();
            if state.free > 0 {
                state.free -= 1;
                return Slot(self);
            }
            let (sender, receiver) = oneshot::channel();
            match lane {
                Lane::Urgent => state.urgent.push_back(sender),
                Lane::Routine => state.routine.push_back(sender),
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
            if next.send(()).is_ok() {
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

    #[tokio::test]
    async fn urgent_waiters_are_served_before_routine_ones_each_in_arrival_order() {
        let slots = Arc::new(Slots::new(1));
        let held = slots.try_acquire().expect("one free slot");
        assert!(slots.try_acquire().is_none());
        let order: Arc<Mutex<Vec<&str>>> = Arc::default();
        let mut tasks = Vec::new();
        for (name, lane) in [
            ("routine 1", Lane::Routine),
            ("routine 2", Lane::Routine),
            ("urgent 1", Lane::Urgent),
            ("urgent 2", Lane::Urgent),
        ] {
            let (waiter, order) = (Arc::clone(&slots), Arc::clone(&order));
            tasks.push(tokio::spawn(async move {
                let _slot = waiter.acquire(lane).await;
                order
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(name);
            }));
            // Queued in this order.
            while {
                let state = slots.state();
                state.urgent.len() + state.routine.len()
            } < tasks.len()
            {
                tokio::task::yield_now().await;
            }
        }
        drop(held);
        for task in tasks {
            task.await.expect("waiter");
        }
        assert_eq!(
            *order.lock().unwrap_or_else(PoisonError::into_inner),
            ["urgent 1", "urgent 2", "routine 1", "routine 2"]
        );
        assert!(slots.try_acquire().is_some(), "the slot is free again");
    }

    #[tokio::test]
    async fn a_waiter_that_stops_waiting_loses_no_slot() {
        let slots = Slots::new(1);
        let held = slots.try_acquire().expect("free");
        // Dropped while queued: passed over.
        let mut gone = Box::pin(slots.acquire(Lane::Urgent));
        assert!((&mut gone).now_or_never().is_none());
        drop(gone);
        // Handed the slot, then dropped before it looked: the slot goes back.
        let mut handed = Box::pin(slots.acquire(Lane::Routine));
        assert!((&mut handed).now_or_never().is_none());
        drop(held);
        drop(handed);
        assert!(slots.try_acquire().is_some(), "no slot was lost");
    }
}
