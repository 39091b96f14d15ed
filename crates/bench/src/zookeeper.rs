//! zookeeper: filled in by the zookeeper backend.

use crate::{BoxError, Subject};

pub async fn subject(_url: &str) -> Result<Subject, BoxError> {
    Err("the zookeeper backend is not measured yet".into())
}
