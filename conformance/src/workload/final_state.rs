//! The protected resource's state at the end of a run, the ground truth the history is judged
//! against.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// One key's row in the resource: the set and the greatest fence the resource accepted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyState {
    /// The set's elements.
    pub elements: BTreeSet<u64>,
    /// The resource's `last_fence`; `None` if nothing was ever accepted for the key.
    pub last_fence: Option<u64>,
}

impl KeyState {
    /// A row holding `elements` with `last_fence`.
    pub fn new(elements: impl IntoIterator<Item = u64>, last_fence: Option<u64>) -> Self {
        KeyState {
            elements: elements.into_iter().collect(),
            last_fence,
        }
    }
}

/// Every key's final row, read once after the run (all faults healed, all workers stopped).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalState {
    /// Rows by key.
    pub keys: BTreeMap<String, KeyState>,
}

impl FinalState {
    /// An empty state, to fill with [`FinalState::with`].
    pub fn new() -> Self {
        FinalState::default()
    }

    /// Adds (or replaces) one key's row.
    pub fn with(mut self, key: impl Into<String>, state: KeyState) -> Self {
        self.keys.insert(key.into(), state);
        self
    }

    /// One key's row.
    pub fn get(&self, key: &str) -> Option<&KeyState> {
        self.keys.get(key)
    }
}
