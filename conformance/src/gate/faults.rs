//! The faults a harness injects into the store behind a gate: connections cut, the store
//! restarted, and writes held at the store so that a cut is certain to find one in flight.

use async_trait::async_trait;

use crate::faults::unsupported;

/// Faults of the store behind a gate, where the harness can inject them.
///
/// # Contract
/// * [`GateFaults::cut_connections`] cuts only the gate's connections: what the harness itself
///   holds (the hold of [`GateFaults::hold_writes`], its own admin connections) survives it.
/// * [`GateFaults::hold_writes`] holds writes at the store, not in the gate's process: a write
///   the gate sends while the hold lasts reaches the store (or the proxy in front of it) and
///   waits there, neither applied nor answered, until the hold is released or the write's
///   connection is cut. Writes sent on new connections meanwhile (a client's retry) are held
///   as well. Reads may pass or wait; the suite does not read while writes are held.
/// * A write held when the connections are cut is never applied from that request: the store
///   rolls it back with its connection, or never received it. Only a request sent again by the
///   gate's client can land, and only once the hold is released.
/// * A harness that cannot hold writes answers [`leasehold_core::Error::Unsupported`]; the
///   suite then cuts without a hold and says that it could not make the outcome certainly
///   unknown.
#[async_trait]
pub trait GateFaults: Send + Sync {
    /// Cuts the gate's connections to the store, as a network failure or a store-side kill
    /// does: requests in flight get no answer (their outcome unknown to the caller), and the
    /// gate must connect again for the next one.
    async fn cut_connections(&self) -> leasehold_core::Result<()>;

    /// Restarts the store on its data (a crash and recovery); returns once it serves again.
    async fn restart(&self) -> leasehold_core::Result<()>;

    /// Holds writes at the store until the returned handle is released (or dropped); returns
    /// once the hold is in place, so that a write sent after it returns is held. Defaults to
    /// [`leasehold_core::Error::Unsupported`].
    async fn hold_writes(&self) -> leasehold_core::Result<Box<dyn HeldWrites>> {
        Err(unsupported("holding writes at the store"))
    }
}

/// Writes held at the store by [`GateFaults::hold_writes`].
///
/// # Contract
/// * [`HeldWrites::release`] lets the store take writes again, held ones still connected
///   included, and returns once it does.
/// * Dropping the handle without releasing it lets the store go on too, at the latest a few
///   seconds later: a scenario that fails while writes are held leaves no store held behind.
/// * [`HeldWrites::waiting`] counts what the store itself sees waiting on the hold; it never
///   guesses from the gate's side.
#[async_trait]
pub trait HeldWrites: Send + Sync {
    /// How many writes wait on the hold now (sent, neither applied nor answered), as the store
    /// or the proxy in front of it sees them; `None` where it cannot tell.
    async fn waiting(&self) -> leasehold_core::Result<Option<usize>>;

    /// Whether a held write that the cut dropped is lost for good: the store discards it and
    /// the gate's client never sends it again (no retry on a new connection). Then the writer
    /// cannot have been accepted and the value must be the one before the write. `false` where
    /// the client may send it again after the release (an HTTP client's retries).
    fn cut_loses_held_writes(&self) -> bool;

    /// Ends the hold: the store takes writes again.
    async fn release(self: Box<Self>) -> leasehold_core::Result<()>;
}
