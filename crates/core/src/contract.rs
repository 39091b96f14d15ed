//! The contract: what every authority promises and what it hands out.
//!
//! [`Authority`] is the trait every backend implements, each method with its `# Contract`;
//! [`Grant`] (a key, an [`OwnerToken`], a [`Fence`] and a local deadline) is what an acquisition
//! hands out; [`Capabilities`] says what a backend promises ([`FenceSafety`], [`ExclusionSafety`],
//! [`TtlRange`], [`WaitStrategy`]); [`Error`] separates bad input, contention and outages;
//! [`FencedResource`] is the other side of a fence, the resource that refuses stale writes.

pub(crate) mod authority;
pub(crate) mod capabilities;
pub(crate) mod client_options;
pub(crate) mod error;
pub(crate) mod exclusion;
pub(crate) mod fence;
pub(crate) mod grant;
pub(crate) mod inspection;
pub(crate) mod key;
pub(crate) mod key_prefix;
pub(crate) mod lost;
pub(crate) mod margin;
pub(crate) mod owner;
pub(crate) mod resource;
pub(crate) mod ttl;

pub use authority::{Authority, Released, Revoked, MAX_VALUE_LEN};
pub use capabilities::{Capabilities, RevocationNotice, WaitStrategy};
pub use client_options::ClientOptions;
pub use error::{ArcError, BoxError, Error, Result};
pub use exclusion::ExclusionSafety;
pub use fence::{Epoch, Fence, FenceSafety, FencingToken};
pub use grant::Grant;
pub use inspection::{Inspection, OwnerId};
pub use key::{LockKey, MAX_KEY_LEN};
pub use key_prefix::KeyPrefix;
pub use lost::LostReason;
pub use margin::SafetyMargin;
pub use owner::OwnerToken;
pub use resource::{FencedRegister, FencedResource, Guarded};
pub use ttl::TtlRange;
