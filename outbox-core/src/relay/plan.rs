//! Turning a shard's oldest rows into the groups to deliver, in order.

use crate::columns::ModelRow;
use crate::handler::DeliveryError;
use crate::hashed::{Map, Set};
use crate::id::Id;
use crate::model::{MessageId, ShardKey};
use crate::registry::{CategoryInfo, Registry};
use crate::replicated::ModelTable;
use crate::store::{Acknowledgement, GroupKey, GroupTail, StoredMessage};

/// One delivery: a coalescing group (or a single message of a non-coalescing category).
#[derive(Debug)]
pub(crate) struct Group {
    pub(crate) key: GroupKey,
    pub(crate) info: CategoryInfo,
    /// The newest row seen: its payload is delivered.
    pub(crate) newest: StoredMessage,
    /// Every row of the group the relay read: the rows the delivery of `newest` covers, and
    /// the only ones it acknowledges. A row of the group that was not visible when it was read
    /// (an older id whose transaction committed later) is not among them, and survives to be
    /// delivered by a later pass.
    pub(crate) ids: Vec<MessageId>,
    /// A replicated model's row for `newest`, read with the rows of the other groups the
    /// relay's drains read at the same time (`Some(None)`: no row has the key, the object is
    /// gone); `None` if it was not read that way, and the delivery reads it itself.
    pub(crate) model_row: Option<Option<ModelRow>>,
}

impl Group {
    /// How many rows the delivery covers.
    pub(crate) fn rows(&self) -> u64 {
        self.ids.len() as u64
    }

    /// What the delivery acknowledges: the rows read, in id order, taken from the group (it is
    /// done with).
    fn take_acknowledgement(&mut self) -> Acknowledgement {
        let mut ids = std::mem::take(&mut self.ids);
        ids.sort_unstable();
        Acknowledgement {
            group: self.key,
            ids,
        }
    }

    /// What the delivery acknowledges: the rows read, in id order.
    pub(crate) fn acknowledgement(&self) -> Acknowledgement {
        let mut ids = self.ids.clone();
        ids.sort_unstable();
        Acknowledgement {
            group: self.key,
            ids,
        }
    }
}

/// Up to this many groups, a plan finds a coalescing group by looking at each: most heads
/// hold one group or a few, for which a map would cost more to build than it saves.
const SCANNED: usize = 8;

/// The groups found at the head of a shard, in delivery order.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub(crate) groups: Vec<Group>,
    /// A row that blocks the shard after the groups (unknown category, wrong scope).
    pub(crate) blocked: Option<DeliveryError>,
    /// Each coalescing group's place, once the plan holds more than [`SCANNED`] groups.
    coalescing: Map<GroupKey, usize>,
}

impl Plan {
    /// Groups `head` (the shard's oldest rows, in id order). Groups come in the order of their
    /// oldest row. A row the registry cannot deliver blocks the shard: no group starts
    /// after it, though rows of groups that started before it still coalesce into them.
    pub(crate) fn new(head: Vec<StoredMessage>, shard: &ShardKey, registry: &Registry) -> Self {
        let mut plan = Self {
            groups: Vec::with_capacity(head.len()),
            ..Self::default()
        };
        for row in head {
            let key = GroupKey {
                category: row.category,
                object_identifier: row.object_identifier,
            };
            if plan.blocked.is_some() {
                // A row of no group started before the block waits behind it.
                let _ = plan.coalesce_row(key, row);
                continue;
            }
            let Some(info) = registry.category(row.category) else {
                plan.blocked = Some(DeliveryError::UnknownCategory {
                    message_id: row.id,
                    category: row.category,
                });
                continue;
            };
            if info.identity.scope != shard.scope || row.scope != shard.scope {
                plan.blocked = Some(DeliveryError::ScopeMismatch {
                    message_id: row.id,
                    category: info.identity.name,
                    expected: info.identity.scope,
                    expected_name: info.identity.scope_name,
                    found: row.scope,
                });
                continue;
            }
            let row = if info.identity.coalesce {
                match plan.coalesce_row(key, row) {
                    Ok(()) => continue,
                    Err(row) => row,
                }
            } else {
                row
            };
            plan.push(Group {
                key,
                info: info.clone(),
                ids: vec![row.id],
                newest: row,
                model_row: None,
            });
        }
        plan
    }

    /// The acknowledgements of the groups at `through` (their places, in the order their
    /// deliveries got through), their rows taken from the plan: it is done with them.
    pub(crate) fn acknowledgements(&mut self, through: &[usize]) -> Vec<Acknowledgement> {
        let mut acks = Vec::with_capacity(through.len());
        for &at in through {
            if let Some(group) = self.groups.get_mut(at) {
                acks.push(group.take_acknowledgement());
            }
        }
        acks
    }

    /// Adds `group` after the others.
    fn push(&mut self, group: Group) {
        let (key, coalesce) = (group.key, group.info.identity.coalesce);
        self.groups.push(group);
        let count = self.groups.len();
        if count == SCANNED + 1 {
            self.coalescing = self
                .groups
                .iter()
                .enumerate()
                .filter(|(_, group)| group.info.identity.coalesce)
                .map(|(index, group)| (group.key, index))
                .collect();
        } else if count > SCANNED + 1 && coalesce {
            self.coalescing.insert(key, count - 1);
        }
    }

    /// The place of the coalescing group `key`, if the plan has it.
    fn coalescing_group(&self, key: GroupKey) -> Option<usize> {
        if self.groups.len() <= SCANNED {
            self.groups
                .iter()
                .position(|group| group.info.identity.coalesce && group.key == key)
        } else {
            self.coalescing.get(&key).copied()
        }
    }

    /// Takes `row` into the coalescing group `key`, if the plan has it; else gives it back.
    fn coalesce_row(&mut self, key: GroupKey, row: StoredMessage) -> Result<(), StoredMessage> {
        let Some(index) = self.coalescing_group(key) else {
            return Err(row);
        };
        let group = &mut self.groups[index];
        group.ids.push(row.id);
        if row.id > group.newest.id {
            group.newest = row;
        }
        Ok(())
    }

    /// Takes `ids` (with `newest` among them) into the coalescing group `key`, if the plan
    /// has it.
    fn coalesce_ids(&mut self, key: GroupKey, newest: &StoredMessage, ids: &[MessageId]) {
        if let Some(index) = self.coalescing_group(key) {
            let group = &mut self.groups[index];
            if newest.id > group.newest.id {
                group.newest = newest.clone();
            }
            group.ids.extend_from_slice(ids);
        }
    }

    /// The coalescing groups, whose newest rows may lie beyond the rows read so far.
    pub(crate) fn coalescing_keys(&self) -> Vec<GroupKey> {
        self.groups
            .iter()
            .filter(|group| group.info.identity.coalesce)
            .map(|group| group.key)
            .collect()
    }

    /// The replicated models' objects whose rows the plan's deliveries read, each table with
    /// the keys of its objects (each key once).
    pub(crate) fn model_keys(&self) -> Vec<(ModelTable, Vec<Id>)> {
        let mut tables: Vec<(ModelTable, Vec<Id>)> = Vec::new();
        let mut seen = Set::default();
        for group in &self.groups {
            let Some(table) = group.info.model else {
                continue;
            };
            let key = group.newest.object_identifier;
            if !seen.insert((table.table, key)) {
                continue;
            }
            match tables.iter_mut().find(|(known, _)| *known == table) {
                Some((_, keys)) => keys.push(key),
                None => tables.push((table, vec![key])),
            }
        }
        tables
    }

    /// Gives the groups of `table`'s objects their rows: `rows[i]` is the row of `keys[i]`.
    pub(crate) fn give_rows(&mut self, table: &ModelTable, keys: &[Id], rows: &[Option<ModelRow>]) {
        let rows: Map<Id, &Option<ModelRow>> = keys.iter().copied().zip(rows).collect();
        for group in &mut self.groups {
            if group.info.model.as_ref() == Some(table)
                && let Some(row) = rows.get(&group.newest.object_identifier)
            {
                group.model_row = Some((*row).clone());
            }
        }
    }

    /// Takes in a group's rows found beyond the rows read so far.
    pub(crate) fn extend(&mut self, tail: &GroupTail) {
        let key = GroupKey {
            category: tail.newest.category,
            object_identifier: tail.newest.object_identifier,
        };
        self.coalesce_ids(key, &tail.newest, &tail.ids);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::NoOp;
    use crate::model::{Category, CategoryId, Scope, ScopeId};
    use crate::registry::Registry;

    struct Org;
    impl Scope for Org {
        const ID: ScopeId = ScopeId(1);
        const NAME: &'static str = "org";
    }
    struct Update;
    impl Category for Update {
        type Scope = Org;
        type Payload = u32;
        const ID: CategoryId = CategoryId(1);
        const NAME: &'static str = "update";
    }
    struct Event;
    impl Category for Event {
        type Scope = Org;
        type Payload = u32;
        const ID: CategoryId = CategoryId(2);
        const NAME: &'static str = "event";
        const COALESCE: bool = false;
    }

    fn registry() -> Registry {
        Registry::builder()
            .handle::<Update>(NoOp)
            .handle::<Event>(NoOp)
            .build()
            .unwrap()
    }

    fn row(id: i64, category: i32, object: i64) -> StoredMessage {
        StoredMessage {
            id: MessageId(id),
            category: CategoryId(category),
            scope: ScopeId(1),
            object_identifier: object.into(),
            payload: id.to_string(),
            created_at: std::time::UNIX_EPOCH,
            metadata: None,
        }
    }

    fn summary(plan: &Plan) -> Vec<(i32, i64, i64, u64)> {
        plan.groups
            .iter()
            .map(|g| {
                (
                    g.key.category.0,
                    g.key.object_identifier.as_integer().unwrap(),
                    g.newest.id.0,
                    g.rows(),
                )
            })
            .collect()
    }

    #[test]
    fn groups_follow_their_oldest_row_and_carry_the_newest() {
        let head = [
            row(1, 1, 10),
            row(2, 2, 10),
            row(3, 1, 20),
            row(4, 1, 10),
            row(5, 2, 10),
        ];
        let plan = Plan::new(head.to_vec(), &ShardKey::local(ScopeId(1), 1), &registry());
        assert_eq!(
            summary(&plan),
            [(1, 10, 4, 2), (2, 10, 2, 1), (1, 20, 3, 1), (2, 10, 5, 1)]
        );
        assert!(plan.blocked.is_none());
        assert_eq!(
            plan.groups[0].ids,
            [MessageId(1), MessageId(4)],
            "a coalesced delivery acknowledges the rows it read, and only those"
        );
        assert_eq!(
            plan.groups[1].ids,
            [MessageId(2)],
            "an event acknowledges itself"
        );
        assert_eq!(plan.coalescing_keys().len(), 2);
    }

    /// Beyond a few groups a plan finds them by a map: the same groups, the same rows, and a
    /// tail read later still finds its group.
    #[test]
    fn many_groups_coalesce_as_a_few_do() {
        let objects = 3 * SCANNED as i64;
        let mut head: Vec<StoredMessage> = (0..objects)
            .map(|object| row(object + 1, 1, object))
            .collect();
        head.push(row(objects + 1, 2, 0));
        head.extend((0..objects).map(|object| row(objects + 2 + object, 1, object)));
        let mut plan = Plan::new(head, &ShardKey::local(ScopeId(1), 1), &registry());
        assert_eq!(plan.groups.len(), objects as usize + 1);
        for (object, group) in plan.groups.iter().take(objects as usize).enumerate() {
            let object = object as i64;
            assert_eq!(
                group.ids,
                [MessageId(object + 1), MessageId(objects + 2 + object)]
            );
            assert_eq!(group.newest.id, MessageId(objects + 2 + object));
        }
        assert_eq!(plan.groups[objects as usize].ids, [MessageId(objects + 1)]);
        let last = objects - 1;
        plan.extend(&GroupTail {
            newest: row(1_000, 1, last),
            ids: vec![MessageId(1_000)],
        });
        let group = &plan.groups[last as usize];
        assert_eq!(group.newest.id, MessageId(1_000));
        assert_eq!(group.rows(), 3);
    }

    #[test]
    fn an_unknown_row_blocks_new_groups_but_not_coalescing() {
        let head = [row(1, 1, 10), row(2, 9, 10), row(3, 1, 20), row(4, 1, 10)];
        let plan = Plan::new(head.to_vec(), &ShardKey::local(ScopeId(1), 1), &registry());
        assert_eq!(summary(&plan), [(1, 10, 4, 2)]);
        assert!(matches!(
            plan.blocked,
            Some(DeliveryError::UnknownCategory {
                message_id: MessageId(2),
                ..
            })
        ));
    }

    #[test]
    fn a_row_of_the_wrong_scope_blocks() {
        let mut wrong = row(2, 1, 10);
        wrong.scope = ScopeId(7);
        let plan = Plan::new(
            vec![row(1, 2, 1), wrong],
            &ShardKey::local(ScopeId(1), 1),
            &registry(),
        );
        assert_eq!(plan.groups.len(), 1);
        assert!(matches!(
            plan.blocked,
            Some(DeliveryError::ScopeMismatch {
                found: ScopeId(7),
                ..
            })
        ));
    }

    #[test]
    fn newer_rows_beyond_the_head_extend_their_group() {
        let mut plan = Plan::new(
            vec![row(1, 1, 10)],
            &ShardKey::local(ScopeId(1), 1),
            &registry(),
        );
        plan.extend(&GroupTail {
            newest: row(9, 1, 10),
            ids: vec![MessageId(5), MessageId(9)],
        });
        plan.extend(&GroupTail {
            newest: row(12, 1, 99),
            ids: vec![MessageId(12)],
        });
        assert_eq!(summary(&plan), [(1, 10, 9, 3)]);
        assert_eq!(
            plan.groups[0].ids,
            [MessageId(1), MessageId(5), MessageId(9)],
            "the rows between the head and the newest are covered; none unseen"
        );
    }
}
