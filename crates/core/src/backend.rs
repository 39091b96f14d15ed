//! What only backend authors need: the plumbing every backend crate shares, kept out of the
//! application's API (the `leasehold` facade does not re-export this module).
//!
//! * [`grant`]: the one way to make a [`crate::Grant`], so that only authorities hand them out.
//! * Connection URLs: [`ConnectionUrl`] (one parser for every backend's URL), [`UrlParams`]
//!   (query parameters read strictly), [`redact_url`] and [`Secret`] (never printed).
//! * Acquisitions nobody awaits any more: [`claim_or_give_back`] runs a request to its end and
//!   gives back a lease it took after its caller left.
//! * Batches: [`batch_answers`], [`batch_failed`], [`check_batch_ttls`] for `renew_many`.
//! * [`Backoff`] for polling, [`SmallestKeys`] for `list_keys`, [`check_proclaimed`] for
//!   `proclaim`.

pub(crate) mod backoff;
pub(crate) mod batch_answers;
pub(crate) mod connection_url;
pub(crate) mod grant;
pub(crate) mod redact;
pub(crate) mod unclaimed;
pub(crate) mod url_params;

pub use crate::contract::authority::check_proclaimed;
pub use crate::contract::key_prefix::SmallestKeys;
pub use crate::recipes::check_canonical;
pub use backoff::Backoff;
pub use batch_answers::{batch_answers, batch_failed, check_batch_ttls};
pub use connection_url::{ConnectionUrl, UrlHost};
pub use grant::grant;
pub use redact::{redact_url, url_secrets, Secret};
pub use unclaimed::{claim_or_give_back, Left, Unanswered};
pub use url_params::{percent_decode, UrlParams};
