//! The in-memory store's tables and the rules the SQL backends' statements apply to them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, SystemTime};

use super::clock::later;
use crate::backfill::{
    BackfillBatch, BackfillModel, BackfillOptions, BackfillOutcome, BackfillStart, BackfillState,
    BackfillStep, batch_size,
};
use crate::columns::ModelRow;
use crate::error::Error;
use crate::id::Id;
use crate::model::{CategoryId, Message, MessageId, ShardKey};
use crate::store::{
    Acknowledgement, ClaimOptions, DeadLetter, DeadLetterFilter, DeadLettering, DiscoveryPage,
    FORGET_RELAYS_AFTER, GroupKey, GroupTail, Heartbeat, Lease, OutboxStatus, Outcome, Pause,
    PauseTarget, PendingMessage, RelayInfo, ShardFilter, ShardInfo, ShardList, ShardQuery,
    ShardState, ShardStatus, StoredMessage,
};

/// One pending row of `outbox_messages`.
#[derive(Debug, Clone)]
pub(super) struct Row {
    pub(super) shard: ShardKey,
    pub(super) category: CategoryId,
    pub(super) object_identifier: Id,
    pub(super) payload: String,
    pub(super) created_at: SystemTime,
    pub(super) metadata: Option<String>,
}

impl Row {
    fn stored(&self, id: MessageId) -> StoredMessage {
        StoredMessage {
            id,
            category: self.category,
            scope: self.shard.scope,
            object_identifier: self.object_identifier,
            payload: self.payload.clone(),
            created_at: self.created_at,
            metadata: self.metadata.clone(),
        }
    }

    fn group(&self) -> GroupKey {
        GroupKey {
            category: self.category,
            object_identifier: self.object_identifier,
        }
    }

    fn pending(&self, id: MessageId) -> PendingMessage {
        PendingMessage::new(
            id,
            self.shard.clone(),
            self.category,
            self.object_identifier,
            self.payload.clone(),
            self.created_at,
        )
        .with_metadata(self.metadata.clone())
    }
}

/// One row of `outbox_shards`: a shard's lease and failures.
/// A parked shard's retry time: the end of year 9999, as the SQL stores record it.
fn parked_until() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_799)
}

#[derive(Debug, Clone)]
struct Record {
    attempts: u32,
    /// When the failures at the head began.
    first_failed_at: Option<SystemTime>,
    last_error: Option<String>,
    retry_at: Option<SystemTime>,
    watermark: MessageId,
    parked_category: Option<CategoryId>,
    lease_owner: Option<String>,
    lease_token: Option<i64>,
    lease_expires_at: Option<SystemTime>,
}

impl Record {
    fn lease_lapsed(&self, now: SystemTime) -> bool {
        self.lease_expires_at.is_none_or(|at| at <= now)
    }

    fn release_lease(&mut self) {
        self.lease_owner = None;
        self.lease_expires_at = None;
    }
}

impl Default for Record {
    fn default() -> Self {
        Self {
            attempts: 0,
            first_failed_at: None,
            last_error: None,
            retry_at: None,
            watermark: MessageId(0),
            parked_category: None,
            lease_owner: None,
            lease_token: None,
            lease_expires_at: None,
        }
    }
}

/// The tables.
#[derive(Debug, Default)]
pub(super) struct Tables {
    last_id: i64,
    last_token: i64,
    messages: BTreeMap<MessageId, Row>,
    /// The pending ids of each shard that has any: what discovery walks, in key order.
    shards: BTreeMap<ShardKey, BTreeSet<MessageId>>,
    records: BTreeMap<ShardKey, Record>,
    dead_letters: BTreeMap<MessageId, DeadLetter>,
    pauses: BTreeMap<PauseTarget, Pause>,
    /// Replicated models' rows, as JSON objects keyed by column, by table and key.
    models: HashMap<(&'static str, Id), serde_json::Value>,
    /// The backfills' watermarks.
    backfills: BTreeMap<CategoryId, BackfillState>,
    /// The relays' last heartbeats, and when each came.
    relays: BTreeMap<String, (Heartbeat, SystemTime)>,
}

impl Tables {
    pub(super) fn beat(&mut self, heartbeat: &Heartbeat, now: SystemTime) {
        self.relays
            .retain(|_, (beat, seen)| later(*seen, beat.expires_in + FORGET_RELAYS_AFTER) > now);
        self.relays
            .insert(heartbeat.worker.clone(), (heartbeat.clone(), now));
    }

    pub(super) fn leave(&mut self, worker: &str) {
        self.relays.remove(worker);
    }

    pub(super) fn relays(&self, now: SystemTime) -> Vec<RelayInfo> {
        self.relays
            .values()
            .filter(|(beat, seen)| later(*seen, beat.expires_in + FORGET_RELAYS_AFTER) > now)
            .map(|(beat, seen)| {
                let live = later(*seen, beat.expires_in) > now;
                RelayInfo::new(beat.clone(), *seen, live)
            })
            .collect()
    }

    pub(super) fn insert(&mut self, row: Row) -> MessageId {
        self.last_id += 1;
        let id = MessageId(self.last_id);
        self.shards.entry(row.shard.clone()).or_default().insert(id);
        self.messages.insert(id, row);
        id
    }

    pub(super) fn put_model(&mut self, table: &'static str, key: Id, row: serde_json::Value) {
        self.models.insert((table, key), row);
    }

    pub(super) fn remove_model(&mut self, table: &'static str, key: Id) -> bool {
        self.models.remove(&(table, key)).is_some()
    }

    /// One tick of a model's backfill (see [`crate::store::Store::backfill`]): the batch, and the
    /// messages it wrote.
    pub(super) fn backfill(
        &mut self,
        model: &BackfillModel,
        options: &BackfillOptions,
        now: SystemTime,
    ) -> Result<(BackfillBatch, Vec<Message>), Error> {
        let recorded = self
            .backfills
            .entry(model.category)
            .or_insert_with(|| BackfillState::new(model.category, model.name));
        recorded.model = model.name.to_owned();
        recorded.declared_version = recorded.declared_version.max(model.version);
        let state = recorded.clone();
        let BackfillStep::Walk { version, after } = state.next_step(model.version) else {
            let gated = BackfillBatch {
                model: model.name,
                outcome: BackfillOutcome::Gated,
                state: Some(state),
            };
            return Ok((gated, Vec::new()));
        };
        let size = batch_size(options.budget, self.messages.len());
        let mut keys: Vec<Id> = self
            .models
            .keys()
            .filter(|(table, key)| *table == model.table.table && after.is_none_or(|a| *key > a))
            .map(|(_, key)| *key)
            .collect();
        keys.sort_unstable();
        keys.truncate(size);
        let mut messages = Vec::new();
        let mut last = None;
        for key in &keys {
            let row = self.model(model.table.table, *key).unwrap_or_default();
            let walked = model.walk(&row, state.destinations.as_deref())?;
            messages.extend(walked.messages);
            last = Some(walked.key);
        }
        for message in &messages {
            self.insert(super::row(message, now));
        }
        let next = state.after_batch(version, keys.len(), size, last, &options.worker, now);
        self.backfills.insert(model.category, next.clone());
        let batch = BackfillBatch {
            model: model.name,
            outcome: BackfillOutcome::Walked {
                version,
                size,
                rows: keys.len(),
                messages: messages.len(),
                complete: next.done_version == version,
            },
            state: Some(next),
        };
        Ok((batch, messages))
    }

    pub(super) fn backfills(&self) -> Vec<BackfillState> {
        self.backfills.values().cloned().collect()
    }

    pub(super) fn start_backfill(
        &mut self,
        start: &BackfillStart,
        now: SystemTime,
    ) -> BackfillState {
        let state = self
            .backfills
            .entry(start.category)
            .or_insert_with(|| BackfillState::new(start.category, ""));
        if let Some(model) = &start.model
            && state.model.is_empty()
        {
            model.clone_into(&mut state.model);
        }
        state.target_version = start.version;
        state.destinations.clone_from(&start.destinations);
        state.updated_at = Some(now);
        state.clone()
    }

    pub(super) fn pause_backfill(&mut self, category: CategoryId, now: SystemTime) -> bool {
        match self.backfills.get_mut(&category) {
            Some(state) if state.target_version > state.done_version => {
                state.target_version = state.done_version;
                state.updated_at = Some(now);
                true
            }
            _ => false,
        }
    }

    pub(super) fn model(&self, table: &'static str, key: Id) -> Option<ModelRow> {
        self.models
            .get(&(table, key))
            .cloned()
            .and_then(ModelRow::from_json)
    }

    fn newest_in(&self, shard: &ShardKey) -> Option<MessageId> {
        self.shards.get(shard).and_then(|ids| ids.last().copied())
    }

    /// Due: nobody holds a live lease on it, and it is not backing off or has a message newer
    /// than its failure.
    fn is_due(&self, shard: &ShardKey, now: SystemTime) -> bool {
        !self.is_paused(shard)
            && self.records.get(shard).is_none_or(|record| {
                record.lease_lapsed(now)
                    && (record.retry_at.is_none_or(|at| at <= now)
                        || self
                            .newest_in(shard)
                            .is_some_and(|newest| newest > record.watermark))
            })
    }

    /// How long the oldest message of a shard that is not backing off or paused has waited.
    pub(super) fn oldest_due_age(&self, now: SystemTime) -> Option<Duration> {
        self.messages
            .values()
            .find(|row| {
                let waiting = self.records.get(&row.shard).is_some_and(|record| {
                    record.retry_at.is_some_and(|at| at > now)
                        && self
                            .newest_in(&row.shard)
                            .is_none_or(|newest| newest <= record.watermark)
                });
                !waiting && !self.is_paused(&row.shard)
            })
            .map(|row| now.duration_since(row.created_at).unwrap_or_default())
    }

    /// Whether a pause holds `shard`.
    pub(super) fn is_paused(&self, shard: &ShardKey) -> bool {
        self.pauses.keys().any(|target| {
            target.pauses(shard, |category| {
                self.shards
                    .get(shard)
                    .is_some_and(|ids| ids.iter().any(|id| self.messages[id].category == category))
            })
        })
    }

    pub(super) fn discover(
        &self,
        after: Option<&ShardKey>,
        limit: usize,
        now: SystemTime,
    ) -> DiscoveryPage {
        use std::ops::Bound;
        let start = after.map_or(Bound::Unbounded, |key| Bound::Excluded(key.clone()));
        let limit = limit.max(1);
        let visited: Vec<&ShardKey> = self
            .shards
            .range((start, Bound::Unbounded))
            .take(limit)
            .map(|(shard, _)| shard)
            .collect();
        DiscoveryPage {
            due: visited
                .iter()
                .filter(|shard| self.is_due(shard, now))
                .map(|shard| (*shard).clone())
                .collect(),
            next: (visited.len() == limit)
                .then(|| visited.last().map(|shard| (*shard).clone()))
                .flatten(),
        }
    }

    /// Takes the lease if the shard is due, creating its record if it has none. A lease that
    /// lapsed without a release counts as an attempt at the head, and names its holder.
    pub(super) fn claim(
        &mut self,
        shard: &ShardKey,
        options: &ClaimOptions,
        now: SystemTime,
    ) -> Option<Lease> {
        if !self.is_due(shard, now) {
            return None;
        }
        self.last_token += 1;
        let token = self.last_token;
        let record = self.records.entry(shard.clone()).or_default();
        let previous_owner = record.lease_owner.take();
        record.attempts += u32::from(previous_owner.is_some());
        record.lease_owner = Some(options.worker.clone());
        record.lease_token = Some(token);
        record.lease_expires_at = Some(later(now, options.lease));
        Some(Lease {
            shard: shard.clone(),
            token,
            attempts: record.attempts,
            previous_owner,
        })
    }

    /// The record of the shard `lease` holds, if the lease's token is still its latest.
    fn current(&mut self, lease: &Lease) -> Option<&mut Record> {
        self.records
            .get_mut(&lease.shard)
            .filter(|record| record.lease_token == Some(lease.token))
    }

    pub(super) fn extend_lease(&mut self, lease: &Lease, until: SystemTime) -> bool {
        self.current(lease)
            .map(|record| record.lease_expires_at = Some(until))
            .is_some()
    }

    pub(super) fn fetch(&self, shard: &ShardKey, limit: usize) -> Vec<StoredMessage> {
        self.shards
            .get(shard)
            .into_iter()
            .flatten()
            .take(limit)
            .map(|id| self.messages[id].stored(*id))
            .collect()
    }

    pub(super) fn fetch_newest(
        &self,
        shard: &ShardKey,
        groups: &[GroupKey],
        after: MessageId,
        up_to: MessageId,
    ) -> Vec<GroupTail> {
        let Some(ids) = self.shards.get(shard) else {
            return Vec::new();
        };
        let mut tails: Vec<GroupTail> = Vec::new();
        let mut index: HashMap<GroupKey, usize> = HashMap::new();
        for id in ids.range(MessageId(after.0.saturating_add(1))..=up_to) {
            let row = &self.messages[id];
            let group = row.group();
            if !groups.contains(&group) {
                continue;
            }
            match index.get(&group) {
                Some(&at) => {
                    tails[at].newest = row.stored(*id);
                    tails[at].ids.push(*id);
                }
                None => {
                    index.insert(group, tails.len());
                    tails.push(GroupTail {
                        newest: row.stored(*id),
                        ids: vec![*id],
                    });
                }
            }
        }
        tails
    }

    /// Proves and extends the lease, resets the head's attempts, deletes exactly the rows
    /// acknowledged; deletes nothing if the lease is not current.
    pub(super) fn ack(
        &mut self,
        lease: &Lease,
        acknowledged: &[Acknowledgement],
        until: SystemTime,
    ) -> Result<u64, Error> {
        let Some(record) = self.current(lease) else {
            return Err(Error::LeaseLost {
                shard: lease.shard.clone(),
                token: lease.token,
            });
        };
        record.lease_expires_at = Some(until);
        record.attempts = 0;
        record.first_failed_at = None;
        let ids: Vec<MessageId> = acknowledged
            .iter()
            .flat_map(|ack| ack.ids.iter().copied())
            .collect();
        Ok(self.delete_rows(&lease.shard, &ids).len() as u64)
    }

    /// Deletes the rows `ids` of `shard`; returns those it found, in id order.
    fn delete_rows(&mut self, shard: &ShardKey, ids: &[MessageId]) -> Vec<(MessageId, Row)> {
        let mut deleted = Vec::new();
        for id in ids {
            if self.messages.get(id).is_some_and(|row| &row.shard == shard) {
                let row = self.messages.remove(id).expect("the row was just found");
                deleted.push((*id, row));
            }
        }
        if let Some(pending) = self.shards.get_mut(shard) {
            for (id, _) in &deleted {
                pending.remove(id);
            }
            if pending.is_empty() {
                self.shards.remove(shard);
            }
        }
        deleted.sort_unstable_by_key(|(id, _)| *id);
        deleted
    }

    /// Sets the pending message `id` aside as a dead letter, unless a live lease holds
    /// its shard.
    pub(super) fn set_aside(
        &mut self,
        id: MessageId,
        reason: &str,
        now: SystemTime,
    ) -> Result<DeadLetter, Error> {
        let row = self
            .messages
            .get(&id)
            .cloned()
            .ok_or(Error::NoSuchMessage { id })?;
        let shard = row.shard.clone();
        let record = self.records.entry(shard.clone()).or_default();
        if !record.lease_lapsed(now) {
            return Err(Error::ShardHeld {
                shard,
                owner: record.lease_owner.clone(),
            });
        }
        let letter = DeadLetter::new(
            row.pending(id),
            reason.to_owned(),
            record.attempts,
            record.first_failed_at.unwrap_or(now),
            now,
            record.lease_token.unwrap_or(0),
        );
        let head = self.shards.get(&shard).and_then(|ids| ids.first().copied());
        if head == Some(id) {
            record.attempts = 0;
            record.first_failed_at = None;
            record.last_error = None;
            record.retry_at = None;
            record.parked_category = None;
        }
        self.delete_rows(&shard, &[id]);
        self.dead_letters.insert(id, letter.clone());
        Ok(letter)
    }

    /// Moves a failing group's rows to the dead letters, as an acknowledgement would delete
    /// them.
    pub(super) fn dead_letter(
        &mut self,
        lease: &Lease,
        letter: &DeadLettering,
        until: SystemTime,
        now: SystemTime,
    ) -> Result<u64, Error> {
        let first_failed_at = self
            .current(lease)
            .map(|record| record.first_failed_at.unwrap_or(now));
        let Some(first_failed_at) = first_failed_at else {
            return Err(Error::LeaseLost {
                shard: lease.shard.clone(),
                token: lease.token,
            });
        };
        let moved: Vec<(MessageId, Row)> = letter
            .rows
            .ids
            .iter()
            .filter_map(|id| {
                self.messages
                    .get(id)
                    .filter(|row| row.shard == lease.shard)
                    .map(|row| (*id, row.clone()))
            })
            .collect();
        self.ack(lease, std::slice::from_ref(&letter.rows), until)?;
        for (id, row) in &moved {
            let dead = DeadLetter::new(
                row.pending(*id),
                letter.error.clone(),
                letter.attempts,
                first_failed_at,
                now,
                lease.token,
            );
            self.dead_letters.insert(*id, dead);
        }
        Ok(moved.len() as u64)
    }

    /// Records the outcome and releases the shard; whether the lease was still current.
    pub(super) fn finish(&mut self, lease: &Lease, outcome: &Outcome, now: SystemTime) -> bool {
        let empty = !self.shards.contains_key(&lease.shard);
        let Some(record) = self.current(lease) else {
            return false;
        };
        match outcome {
            // A shard left empty keeps no record, however its drain ended.
            Outcome::Drained | Outcome::Yielded | Outcome::Released if empty => {
                self.records.remove(&lease.shard);
            }
            Outcome::Released => record.release_lease(),
            Outcome::Drained | Outcome::Yielded => {
                record.release_lease();
                record.attempts = 0;
                record.first_failed_at = None;
                record.last_error = None;
                record.retry_at = None;
                record.parked_category = None;
            }
            Outcome::Failed(failure) => {
                record.release_lease();
                if failure.attempts <= 1 || record.first_failed_at.is_none() {
                    record.first_failed_at = Some(now);
                }
                record.attempts = failure.attempts;
                record.last_error = Some(failure.error.clone());
                if failure.parked_category.is_some() {
                    // Parked (S26): due for no time and no message, until unparked.
                    record.retry_at = Some(parked_until());
                    record.watermark = MessageId(i64::MAX);
                } else {
                    record.retry_at = Some(later(now, failure.retry_in));
                    record.watermark = failure.watermark;
                }
                record.parked_category = failure.parked_category;
            }
        }
        true
    }

    pub(super) fn unpark(&mut self, known: &[CategoryId], now: SystemTime) -> u64 {
        let mut unparked = 0;
        for record in self.records.values_mut() {
            let parked = record.parked_category.is_some_and(|c| known.contains(&c));
            if parked && record.retry_at.is_some_and(|at| at > now) {
                record.retry_at = Some(now);
                record.parked_category = None;
                unparked += 1;
            }
        }
        unparked
    }

    pub(super) fn reschedule(&mut self, shard: &ShardKey, now: SystemTime) -> bool {
        match self.records.get_mut(shard) {
            Some(record) if record.retry_at.is_some_and(|at| at > now) => {
                record.retry_at = Some(now);
                true
            }
            _ => false,
        }
    }

    pub(super) fn newest_message_id(&self) -> Option<MessageId> {
        self.messages.keys().next_back().copied()
    }

    pub(super) fn pending_in_shard(&self, shard: &ShardKey, up_to: MessageId) -> u64 {
        self.shards
            .get(shard)
            .map_or(0, |ids| ids.range(..=up_to).count() as u64)
    }

    pub(super) fn pending_messages(&self, limit: usize) -> Vec<PendingMessage> {
        self.messages
            .iter()
            .take(limit)
            .map(|(id, row)| row.pending(*id))
            .collect()
    }

    /// Deletes, in paused shards, up to `limit` rows of coalescing categories that are neither
    /// the oldest nor the newest of their group.
    pub(super) fn compact_paused(&mut self, coalescing: &[CategoryId], limit: usize) -> u64 {
        let paused: Vec<ShardKey> = self
            .shards
            .keys()
            .filter(|shard| self.is_paused(shard))
            .cloned()
            .collect();
        let mut deleted = 0;
        for shard in paused {
            let mut groups: HashMap<GroupKey, Vec<MessageId>> = HashMap::new();
            for id in &self.shards[&shard] {
                let row = &self.messages[id];
                if coalescing.contains(&row.category) {
                    groups.entry(row.group()).or_default().push(*id);
                }
            }
            let middle: Vec<MessageId> = groups
                .values()
                .filter(|ids| ids.len() > 2)
                .flat_map(|ids| ids[1..ids.len() - 1].iter().copied())
                .take(limit - deleted)
                .collect();
            deleted += self.delete_rows(&shard, &middle).len();
            if deleted >= limit {
                break;
            }
        }
        deleted as u64
    }

    /// Every shard with pending messages as operators see it, and whether it is due, in
    /// flight, backing off (not parked) or parked.
    fn shard_infos(&self, now: SystemTime) -> Vec<ShardInfo> {
        self.shards
            .iter()
            .map(|(shard, ids)| self.shard_info(shard, ids, now))
            .collect()
    }

    /// One shard with pending messages `ids`, as operators see it.
    fn shard_info(
        &self,
        shard: &ShardKey,
        ids: &BTreeSet<MessageId>,
        now: SystemTime,
    ) -> ShardInfo {
        let record = self.records.get(shard);
        let newest = ids.last().copied().unwrap_or(MessageId(0));
        let in_flight = record.is_some_and(|record| !record.lease_lapsed(now));
        let waiting = record.is_some_and(|record| {
            record.retry_at.is_some_and(|at| at > now) && newest <= record.watermark
        });
        let parked = waiting && record.is_some_and(|r| r.parked_category.is_some());
        let paused = self.is_paused(shard);
        let status = ShardStatus::of(paused, in_flight, parked, waiting);
        ShardInfo::new(
            shard.clone(),
            ids.len() as u64,
            ids.first().map(|id| self.messages[id].created_at),
            record.map_or(0, |record| record.attempts),
            record.and_then(|record| record.last_error.clone()),
            record
                .and_then(|record| record.retry_at)
                .filter(|_| status != ShardStatus::Parked),
            record.and_then(|record| record.parked_category),
            record
                .filter(|record| !record.lease_lapsed(now))
                .and_then(|record| record.lease_owner.clone()),
            paused,
            status,
        )
    }

    /// `shard`, if it has pending messages.
    pub(super) fn shard_listed(&self, shard: &ShardKey, now: SystemTime) -> Option<ShardInfo> {
        let ids = self.shards.get(shard).filter(|ids| !ids.is_empty())?;
        Some(self.shard_info(shard, ids, now))
    }

    /// The deepest first, then in key order.
    fn deepest(mut shards: Vec<ShardInfo>, limit: usize) -> Vec<ShardInfo> {
        shards.sort_by(|a, b| b.pending.cmp(&a.pending).then(a.shard.cmp(&b.shard)));
        shards.truncate(limit);
        shards
    }

    pub(super) fn status(&self, deepest: usize, now: SystemTime) -> OutboxStatus {
        let shards = self.shard_infos(now);
        let count =
            |status: ShardStatus| shards.iter().filter(|info| info.status == status).count() as u64;
        OutboxStatus {
            pending_messages: self.messages.len() as u64,
            oldest_pending_at: self.messages.values().next().map(|row| row.created_at),
            shards: shards.len() as u64,
            shards_due: count(ShardStatus::Due),
            shards_in_flight: count(ShardStatus::InFlight),
            shards_in_backoff: count(ShardStatus::BackingOff),
            shards_parked: count(ShardStatus::Parked),
            shards_paused: count(ShardStatus::Paused),
            dead_letters: self.dead_letters.len() as u64,
            oldest_dead_letter_at: self
                .dead_letters
                .values()
                .map(|letter| letter.dead_lettered_at)
                .min(),
            deepest: Self::deepest(shards, deepest),
            estimated: false,
            horizon: None,
        }
    }

    pub(super) fn shards_listed(&self, query: &ShardQuery, now: SystemTime) -> ShardList {
        let holds = |shard: &ShardKey, category: CategoryId| {
            self.shards
                .get(shard)
                .into_iter()
                .flatten()
                .any(|id| self.messages[id].category == category)
        };
        let listed = self
            .shard_infos(now)
            .into_iter()
            .filter(|info| match query.filter {
                ShardFilter::Pending => true,
                ShardFilter::Failing => info.attempts > 0 || info.last_error.is_some(),
                ShardFilter::Paused => info.paused,
                ShardFilter::Parked => info.parked_category.is_some(),
            })
            .filter(|info| query.scope.is_none_or(|scope| info.shard.scope == scope))
            .filter(|info| {
                query
                    .category
                    .is_none_or(|category| holds(&info.shard, category))
            })
            .collect();
        ShardList::ranked(Self::deepest(listed, query.limit))
    }

    pub(super) fn shard_messages(&self, shard: &ShardKey, limit: usize) -> Vec<PendingMessage> {
        self.shards
            .get(shard)
            .into_iter()
            .flatten()
            .take(limit)
            .map(|id| self.messages[id].pending(*id))
            .collect()
    }

    pub(super) fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
        now: SystemTime,
    ) -> Vec<DeadLetter> {
        self.dead_letters
            .values()
            .filter(|letter| filter.matches(letter, now))
            .take(filter.limit.unwrap_or(usize::MAX))
            .cloned()
            .collect()
    }

    /// Writes the dead letters `ids` back as new messages, in id order, and removes them; or,
    /// if one is missing, changes nothing.
    pub(super) fn replay_dead_letters(
        &mut self,
        ids: &[MessageId],
        now: SystemTime,
    ) -> Result<Vec<(MessageId, ShardKey)>, Error> {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let missing: Vec<MessageId> = ids
            .iter()
            .filter(|id| !self.dead_letters.contains_key(id))
            .copied()
            .collect();
        if !missing.is_empty() {
            return Err(Error::NoSuchDeadLetter { ids: missing });
        }
        Ok(ids
            .iter()
            .map(|id| {
                let letter = self.dead_letters.remove(id).expect("checked above");
                let shard = letter.shard.clone();
                let id = self.insert(Row {
                    shard: letter.shard,
                    category: letter.category,
                    object_identifier: letter.object_identifier,
                    payload: letter.payload,
                    created_at: now,
                    metadata: letter.metadata,
                });
                (id, shard)
            })
            .collect())
    }

    pub(super) fn purge_dead_letters(&mut self, ids: &[MessageId]) -> u64 {
        ids.iter()
            .filter(|id| self.dead_letters.remove(id).is_some())
            .count() as u64
    }

    pub(super) fn purge_dead_letters_older_than(
        &mut self,
        age: Duration,
        limit: usize,
        now: SystemTime,
    ) -> u64 {
        let filter = DeadLetterFilter::all().older_than(age);
        let mut expired: Vec<(SystemTime, MessageId)> = self
            .dead_letters
            .values()
            .filter(|letter| filter.matches(letter, now))
            .map(|letter| (letter.dead_lettered_at, letter.message_id))
            .collect();
        expired.sort_unstable();
        expired.truncate(limit);
        let ids: Vec<MessageId> = expired.into_iter().map(|(_, id)| id).collect();
        self.purge_dead_letters(&ids)
    }

    pub(super) fn pause(
        &mut self,
        target: &PauseTarget,
        reason: Option<&str>,
        now: SystemTime,
    ) -> bool {
        if self.pauses.contains_key(target) {
            return false;
        }
        let pause = Pause::new(target.clone(), reason.map(str::to_owned), now);
        self.pauses.insert(target.clone(), pause);
        true
    }

    pub(super) fn resume(&mut self, target: &PauseTarget) -> bool {
        self.pauses.remove(target).is_some()
    }

    pub(super) fn pauses(&self) -> Vec<Pause> {
        self.pauses.values().cloned().collect()
    }

    pub(super) fn shard_states(&self) -> Vec<ShardState> {
        self.records
            .iter()
            .map(|(shard, record)| {
                ShardState::new(
                    shard.clone(),
                    record.attempts,
                    record.last_error.clone(),
                    record.retry_at,
                    record.lease_owner.clone(),
                    record.lease_expires_at,
                    record.lease_token,
                    record.parked_category,
                )
            })
            .collect()
    }
}
