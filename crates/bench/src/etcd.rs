//! etcd: filled in by the etcd backend.

use crate::{BoxError, Subject};

pub async fn subject(_url: &str) -> Result<Subject, BoxError> {
    Err("the etcd backend is not measured yet".into())
}
