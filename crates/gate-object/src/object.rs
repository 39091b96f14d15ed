//! One object as a [`FencedResource`]: what the resource suite runs against each store.

use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::{Fence, FencedResource, Guarded, Result};
use object_store::path::Path;
use object_store::ObjectStore;

use crate::{FencedContent, ObjectGate};

/// The object at one path behind an [`ObjectGate`]: a write is [`ObjectGate::write`] with the
/// value as the content, a claim is [`ObjectGate::claim`].
#[derive(Clone, Debug)]
pub struct FencedObject {
    gate: ObjectGate,
    path: Path,
}

impl FencedObject {
    /// The object at `path` in `store`, behind a gate with the default attempts.
    pub fn new(store: Arc<dyn ObjectStore>, path: Path) -> Self {
        FencedObject::with_gate(ObjectGate::new(store), path)
    }

    /// The object at `path` behind `gate`.
    pub fn with_gate(gate: ObjectGate, path: Path) -> Self {
        FencedObject { gate, path }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The object as it is now (`None` before the first claim or write).
    pub async fn read(&self) -> Result<Option<FencedContent>> {
        self.gate.read(&self.path).await
    }
}

#[async_trait]
impl FencedResource for FencedObject {
    async fn claim(&self, fence: Fence) -> Result<Guarded> {
        self.gate.claim(&self.path, fence).await
    }

    async fn write(&self, fence: Fence, value: &str) -> Result<Guarded> {
        self.gate.write(&self.path, fence, value.as_bytes()).await
    }
}
