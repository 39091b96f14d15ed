//! The answers of [`crate::Authority::renew_many`], built the same way by every backend: a
//! batch is sent whole or not at all, each grant it renewed gets its deadline from the moment the
//! batch was sent, and each it did not is no longer ours.

use tokio::time::Instant;

use crate::contract::error::{Error, Result};
use crate::contract::grant::Grant;
use crate::contract::lost::LostReason;
use crate::contract::margin::SafetyMargin;
use crate::contract::ttl::TtlRange;

/// Checks every grant's TTL against `range` before anything is sent: when one is invalid, every
/// grant of the batch gets that error.
pub fn check_batch_ttls(
    grants: &[Grant],
    range: &TtlRange,
) -> std::result::Result<(), Vec<Result<Instant>>> {
    for grant in grants {
        if let Err(e) = range.check(grant.ttl()) {
            return Err(batch_failed(e, grants.len()));
        }
    }
    Ok(())
}

/// Every grant of a batch failed with `error` (no answer: each renewal's outcome is unknown).
pub fn batch_failed(error: Error, grants: usize) -> Vec<Result<Instant>> {
    vec![Err(error); grants]
}

/// A batch's answers: each grant `renewed(i, grant)` says was renewed gets its deadline counted
/// from `sent` (read before the batch left) with `margin`; the others were not ours any more and
/// are [`Error::LeaseLost`] (refused).
pub fn batch_answers(
    grants: &[Grant],
    sent: Instant,
    margin: &SafetyMargin,
    renewed: impl Fn(usize, &Grant) -> bool,
) -> Vec<Result<Instant>> {
    grants
        .iter()
        .enumerate()
        .map(|(i, grant)| {
            if renewed(i, grant) {
                Ok(margin.deadline(sent, grant.ttl()))
            } else {
                Err(Error::lease_lost(grant.key().as_str(), LostReason::Refused))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_batch_gives_every_grant_the_same_error() -> std::result::Result<(), String> {
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
        let answers = batch_failed(Error::unavailable("x", "renew", io), 3);
        if answers.len() != 3 {
            return Err(format!("{} answers for 3 grants", answers.len()));
        }
        for answer in &answers {
            let Err(e) = answer else {
                return Err(format!("a failed batch answered {answer:?}"));
            };
            let source = std::error::Error::source(e).map(ToString::to_string);
            if e.to_string() != "x authority unavailable: renew"
                || source.as_deref() != Some("timed out")
            {
                return Err(format!("a member got {e:?}"));
            }
        }
        if !batch_failed(Error::lease_lost("k", LostReason::Refused), 0).is_empty() {
            return Err("an empty batch got answers".into());
        }
        Ok(())
    }
}
