//! A layer that adds `tracing` spans around every authority call.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tracing::Instrument;

use crate::contract::authority::{Authority, Released, Revoked};
use crate::contract::capabilities::Capabilities;
use crate::contract::error::{Error, Result};
use crate::contract::grant::Grant;
use crate::contract::inspection::Inspection;
use crate::contract::key::LockKey;
use crate::contract::key_prefix::KeyPrefix;
use crate::telemetry::{self, AcquireOutcome};

/// Wraps an authority so each acquire, renew and release runs in a span
/// (`leasehold.acquire`, `leasehold.renew`, `leasehold.release`) that records the key, the TTL,
/// the fence and the outcome, and each acquire attempt is counted
/// (`leasehold_acquire_total`, `leasehold_acquire_wait_seconds`,
/// `leasehold_owner_changes_total`: see [`crate::telemetry`]). `leasehold::connect` applies it
/// to every backend.
///
/// Spans cost next to nothing when no subscriber listens at their level (acquire and release at
/// INFO, renew at DEBUG).
#[derive(Debug, Clone)]
pub struct Instrumented {
    inner: Arc<dyn Authority>,
}

impl Instrumented {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Authority>) -> Self {
        Instrumented { inner }
    }

    fn backend(&self) -> &'static str {
        self.inner.capabilities().backend
    }
}

fn outcome<T>(result: &Result<T>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) => e.kind(),
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl Authority for Instrumented {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Grant>> {
        let span = tracing::info_span!(
            "leasehold.acquire",
            backend = self.inner.capabilities().backend,
            %key,
            ttl_ms = ttl.as_millis() as u64,
            wait = false,
            fence = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let started = Instant::now();
        let result = self
            .inner
            .try_acquire(key, ttl)
            .instrument(span.clone())
            .await;
        let counted = match &result {
            Ok(Some(_)) => AcquireOutcome::Acquired,
            Ok(None) => AcquireOutcome::Busy,
            Err(_) => AcquireOutcome::Error,
        };
        telemetry::acquire(self.backend(), key, counted, started.elapsed());
        match &result {
            Ok(Some(g)) => span
                .record("fence", g.fence().value())
                .record("outcome", "acquired"),
            Ok(None) => span.record("outcome", "held"),
            Err(e) => span.record("outcome", e.kind()),
        };
        result
    }

    async fn try_acquire_all(&self, keys: &[LockKey], ttl: Duration) -> Result<Option<Vec<Grant>>> {
        let span = tracing::info_span!(
            "leasehold.acquire_all",
            backend = self.inner.capabilities().backend,
            keys = keys.len(),
            ttl_ms = ttl.as_millis() as u64,
            outcome = tracing::field::Empty,
        );
        let started = Instant::now();
        let result = self
            .inner
            .try_acquire_all(keys, ttl)
            .instrument(span.clone())
            .await;
        // Counted per key, as that many tries would be; a set the backend cannot take at once
        // was never tried, so it counts nothing.
        let counted = match &result {
            Ok(Some(_)) => Some(AcquireOutcome::Acquired),
            Ok(None) => Some(AcquireOutcome::Busy),
            Err(Error::Unsupported { .. }) => None,
            Err(_) => Some(AcquireOutcome::Error),
        };
        if let Some(counted) = counted {
            for key in keys {
                telemetry::acquire(self.backend(), key, counted, started.elapsed());
            }
        }
        match &result {
            Ok(Some(_)) => span.record("outcome", "acquired"),
            Ok(None) => span.record("outcome", "held"),
            Err(e) => span.record("outcome", e.kind()),
        };
        result
    }

    async fn acquire(&self, key: &LockKey, ttl: Duration, max_wait: Duration) -> Result<Grant> {
        let span = tracing::info_span!(
            "leasehold.acquire",
            backend = self.inner.capabilities().backend,
            %key,
            ttl_ms = ttl.as_millis() as u64,
            max_wait_ms = max_wait.as_millis() as u64,
            fence = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let started = Instant::now();
        let result = self
            .inner
            .acquire(key, ttl, max_wait)
            .instrument(span.clone())
            .await;
        let counted = match &result {
            Ok(_) => AcquireOutcome::Acquired,
            Err(Error::Timeout { .. }) => AcquireOutcome::TimedOut,
            Err(_) => AcquireOutcome::Error,
        };
        telemetry::acquire(self.backend(), key, counted, started.elapsed());
        if let Ok(g) = &result {
            span.record("fence", g.fence().value());
        }
        span.record("outcome", outcome(&result));
        result
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Instant> {
        let span = tracing::debug_span!(
            "leasehold.renew",
            backend = self.inner.capabilities().backend,
            key = %grant.key(),
            fence = grant.fence().value(),
            ttl_ms = ttl.as_millis() as u64,
            outcome = tracing::field::Empty,
        );
        let result = self.inner.renew(grant, ttl).instrument(span.clone()).await;
        span.record("outcome", outcome(&result));
        result
    }

    async fn release(&self, grant: &Grant) -> Result<Released> {
        let span = tracing::info_span!(
            "leasehold.release",
            backend = self.inner.capabilities().backend,
            key = %grant.key(),
            fence = grant.fence().value(),
            outcome = tracing::field::Empty,
        );
        let result = self.inner.release(grant).instrument(span.clone()).await;
        span.record(
            "outcome",
            match &result {
                Ok(Released::Released) => "released",
                Ok(Released::AlreadyGone) => "already_gone",
                Err(e) => e.kind(),
            },
        );
        result
    }

    async fn inspect(&self, key: &LockKey) -> Result<Inspection> {
        let span = tracing::debug_span!(
            "leasehold.inspect",
            backend = self.inner.capabilities().backend,
            %key,
            outcome = tracing::field::Empty,
        );
        let result = self.inner.inspect(key).instrument(span.clone()).await;
        span.record(
            "outcome",
            match &result {
                Ok(i) if i.held => "held",
                Ok(_) => "free",
                Err(e) => e.kind(),
            },
        );
        result
    }

    /// An operator's act, so logged at info with the fence it ended.
    async fn revoke(&self, key: &LockKey) -> Result<Revoked> {
        let span = tracing::info_span!(
            "leasehold.revoke",
            backend = self.inner.capabilities().backend,
            %key,
            fence = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let result = self.inner.revoke(key).instrument(span.clone()).await;
        match &result {
            Ok(Revoked::Revoked { fence }) => span
                .record("fence", fence.value())
                .record("outcome", "revoked"),
            Ok(_) => span.record("outcome", "was_free"),
            Err(e) => span.record("outcome", e.kind()),
        };
        result
    }

    async fn list_keys(&self, prefix: &KeyPrefix, limit: usize) -> Result<Vec<LockKey>> {
        let span = tracing::debug_span!(
            "leasehold.list_keys",
            backend = self.inner.capabilities().backend,
            %prefix,
            limit,
            listed = tracing::field::Empty,
        );
        let result = self
            .inner
            .list_keys(prefix, limit)
            .instrument(span.clone())
            .await;
        if let Ok(keys) = &result {
            span.record("listed", keys.len());
        }
        result
    }

    async fn renew_many(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
        // The same span as a lone renewal (one concept, one name), for a batch of them.
        let span = tracing::debug_span!(
            "leasehold.renew",
            backend = self.inner.capabilities().backend,
            grants = grants.len(),
            renewed = tracing::field::Empty,
        );
        let results = self.inner.renew_many(grants).instrument(span.clone()).await;
        span.record("renewed", results.iter().filter(|r| r.is_ok()).count());
        results
    }

    async fn proclaim(&self, grant: &Grant, value: &[u8]) -> Result<()> {
        let span = tracing::debug_span!(
            "leasehold.proclaim",
            backend = self.inner.capabilities().backend,
            key = %grant.key(),
            fence = grant.fence().value(),
            value_len = value.len(),
            outcome = tracing::field::Empty,
        );
        let result = self
            .inner
            .proclaim(grant, value)
            .instrument(span.clone())
            .await;
        span.record("outcome", outcome(&result));
        result
    }

    async fn wait_for_change(&self, key: &LockKey, max_wait: Duration) -> Result<()> {
        self.inner.wait_for_change(key, max_wait).await
    }

    async fn close(&self) -> Result<()> {
        let span = tracing::info_span!(
            "leasehold.close",
            backend = self.inner.capabilities().backend,
        );
        self.inner.close().instrument(span).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::error::Error;
    use crate::contract::fence::FenceSafety;
    use crate::contract::ttl::TtlRange;

    type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    /// Answers inspect and list_keys only: enough to see that the wrapper passes them on to the
    /// authority it wraps.
    #[derive(Debug)]
    struct InspectOnly(Capabilities);

    #[async_trait]
    impl Authority for InspectOnly {
        fn capabilities(&self) -> &Capabilities {
            &self.0
        }
        async fn try_acquire(&self, _: &LockKey, _: Duration) -> Result<Option<Grant>> {
            Err(Error::InvalidConfig {
                reason: "stub".into(),
            })
        }
        async fn acquire(&self, _: &LockKey, _: Duration, _: Duration) -> Result<Grant> {
            Err(Error::InvalidConfig {
                reason: "stub".into(),
            })
        }
        async fn renew(&self, _: &Grant, _: Duration) -> Result<Instant> {
            Err(Error::InvalidConfig {
                reason: "stub".into(),
            })
        }
        async fn release(&self, _: &Grant) -> Result<Released> {
            Err(Error::InvalidConfig {
                reason: "stub".into(),
            })
        }
        async fn inspect(&self, key: &LockKey) -> Result<Inspection> {
            Ok(Inspection::free("stub", key.clone()))
        }
        async fn list_keys(&self, prefix: &KeyPrefix, _: usize) -> Result<Vec<LockKey>> {
            LockKey::new(format!("{prefix}x")).map(|k| vec![k])
        }
        async fn renew_many(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
            grants
                .iter()
                .map(|_| {
                    Err(Error::InvalidConfig {
                        reason: "stub".into(),
                    })
                })
                .collect()
        }
        async fn proclaim(&self, _: &Grant, _: &[u8]) -> Result<()> {
            Err(Error::InvalidConfig {
                reason: "stub".into(),
            })
        }
        async fn wait_for_change(&self, _: &LockKey, _: Duration) -> Result<()> {
            Ok(())
        }
        async fn revoke(&self, _: &LockKey) -> Result<Revoked> {
            Ok(Revoked::WasFree)
        }
    }

    #[tokio::test]
    async fn inspect_is_passed_on() -> TestResult {
        let ttl = TtlRange::new(
            Duration::from_millis(1),
            Duration::from_secs(1),
            Duration::from_millis(1),
        );
        let caps = Capabilities::new("stub", FenceSafety::Linearizable, true, ttl);
        let wrapped = Instrumented::new(Arc::new(InspectOnly(caps)));
        let key = LockKey::new("k").map_err(|e| format!("the key `k`: {e}"))?;
        let seen = wrapped
            .inspect(&key)
            .await
            .map_err(|e| format!("inspect through the wrapper: {e}"))?;
        assert_eq!(seen, Inspection::free("stub", key));
        let prefix = KeyPrefix::new("p/").map_err(|e| format!("the prefix p/: {e}"))?;
        let listed = wrapped
            .list_keys(&prefix, 10)
            .await
            .map_err(|e| format!("list_keys through the wrapper: {e}"))?;
        assert_eq!(
            listed,
            vec![LockKey::new("p/x").map_err(|e| format!("the key p/x: {e}"))?]
        );
        Ok(())
    }
}
