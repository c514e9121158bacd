//! The values handlers take as [`State<T>`](crate::State), one per type.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

/// The values handlers take as [`State<T>`](crate::State), one per type.
#[derive(Clone, Default)]
pub(crate) struct StateMap(HashMap<TypeId, Arc<dyn Any + Send + Sync>>);

impl StateMap {
    /// The value of type `T`, if one was given.
    pub(crate) fn get<T: Any>(&self) -> Option<&T> {
        self.0.get(&TypeId::of::<T>())?.downcast_ref::<T>()
    }

    /// Whether a value of the type `type_id` was given.
    pub(crate) fn contains(&self, type_id: TypeId) -> bool {
        self.0.contains_key(&type_id)
    }

    /// Keeps `value`, replacing any earlier value of its type.
    pub(crate) fn insert<T: Send + Sync + 'static>(&mut self, value: T) {
        self.0.insert(TypeId::of::<T>(), Arc::new(value));
    }
}
