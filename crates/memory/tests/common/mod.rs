//! What the memory crate's test binaries share: a way to say what failed.
#![allow(dead_code)]

/// What a test was doing when it failed, and why; printed as is when a test returns it.
pub struct Failure(String);

impl std::fmt::Debug for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure(message)
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Self {
        Failure(message.to_string())
    }
}

/// A test's outcome, and what its helpers return: the value, or the [`Failure`] that ends it.
pub type Result<T = (), E = Failure> = std::result::Result<T, E>;

/// `.or_fail("what was being done")?` instead of `unwrap()`: an error, or an `Option` that holds
/// nothing, becomes a [`Failure`] that names the step.
pub trait OrFail<T> {
    /// The value, or a failure naming `what` and the error (or `None`).
    fn or_fail(self, what: impl std::fmt::Display) -> Result<T>;
}

impl<T, E: std::fmt::Debug> OrFail<T> for std::result::Result<T, E> {
    fn or_fail(self, what: impl std::fmt::Display) -> Result<T> {
        self.map_err(|e| Failure(format!("{what}: {e:?}")))
    }
}

impl<T> OrFail<T> for Option<T> {
    fn or_fail(self, what: impl std::fmt::Display) -> Result<T> {
        self.ok_or_else(|| Failure(format!("{what}: None")))
    }
}
