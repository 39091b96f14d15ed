//! Client-side settings every authority shares: the fence epoch, the safety margin of local
//! deadlines, and the request timeout.

use std::time::Duration;

use crate::contract::{Epoch, SafetyMargin};

/// Client-side settings common to every authority.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    /// The deployment epoch in the top bits of every fence (default 0).
    pub epoch: Epoch,
    /// What each grant's local deadline gives up to clock drift.
    pub safety_margin: SafetyMargin,
    /// How long one request may take before it is [`Error::Unavailable`](crate::Error::Unavailable) (default 5 s).
    pub request_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            epoch: Epoch::ZERO,
            safety_margin: SafetyMargin::default(),
            request_timeout: Duration::from_secs(5),
        }
    }
}
