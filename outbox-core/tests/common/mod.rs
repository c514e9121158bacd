//! What core's integration tests share. Each test binary compiles this module on its own and
//! uses part of it.
#![allow(dead_code)]

use std::sync::{Arc, Mutex, PoisonError};

/// What the handlers saw, in order: given to the registry as a state, cloned into each handler.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seen(Arc<Mutex<Vec<String>>>);

impl Seen {
    /// Records one line.
    pub(crate) fn push(&self, line: String) {
        self.lines_mut().push(line);
    }

    /// Every line so far.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.lines_mut().clone()
    }

    /// Every line so far, forgetting them.
    pub(crate) fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.lines_mut())
    }

    fn lines_mut(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
