//! Renewing many leases in two statements, not one per lease.
//!
//! MySQL's `UPDATE` returns no rows, only how many it changed, which cannot say which leases of
//! a batch it renewed. So a batch is one `UPDATE` joined to the batch (passed as one JSON array
//! through `JSON_TABLE`), each row matched as `renew` matches it (key, owner token, fence, live
//! by the database's clock), then one `SELECT` of the batch's rows that are live.
//!
//! The `SELECT` names exactly the leases the `UPDATE` renewed: a row live at the `UPDATE` was
//! renewed by it, so it is live at the `SELECT` (which comes well within its TTL, since a TTL
//! outlasts the request timeout), and still ours (nobody else takes a live row). A row not live
//! at the `UPDATE` stays expired: no renewal of that grant can revive it, and another holder's
//! row has another owner token and fence. Each lease's deadline counts from before the
//! `UPDATE` was sent, as a lone renewal's does.

use leasehold_core::backend::{batch_answers, batch_failed, check_batch_ttls};
use leasehold_core::time::saturating_add;
use leasehold_core::{Error, Grant, Instant, Result};

use super::{ttl_us, Inner, MysqlAuthority, TTL};
use crate::errors::BACKEND;

/// How many leases one statement renews: about 100 bytes of JSON each, far below the smallest
/// default `max_allowed_packet` (16 MiB on MariaDB).
const PER_STATEMENT: usize = 1000;

impl Inner {
    /// Renews `grants`, [`PER_STATEMENT`] at a time; an answer per grant, in order.
    pub(super) async fn renew_batch(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
        if let Err(refused) = check_batch_ttls(grants, &TTL) {
            return refused;
        }
        let mut answers = Vec::with_capacity(grants.len());
        for part in grants.chunks(PER_STATEMENT) {
            answers.extend(self.renew_part(part).await);
        }
        answers
    }

    async fn renew_part(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
        let rows: Vec<(String, String, u64, u64)> = grants
            .iter()
            .map(|grant| {
                let (key, owner, fence) = MysqlAuthority::owner_matches(grant);
                (key, owner, fence, ttl_us(grant.ttl()))
            })
            .collect();
        let batch = match serde_json::to_string(&rows) {
            Ok(batch) => batch,
            Err(e) => {
                let e = Error::backend(BACKEND, "cannot write the renewal batch", e);
                return batch_failed(e, grants.len());
            }
        };
        let (renew, live) = (
            self.statements.renew_many.clone(),
            self.statements.live_of_batch.clone(),
        );
        let sent = Instant::now();
        let found: Result<Vec<(Vec<u8>, u64)>> = self
            .bounded("renew", saturating_add(sent, self.timeout()), move |c| {
                let (renew, live, batch) = (renew.clone(), live.clone(), batch.clone());
                Box::pin(async move {
                    sqlx::query(renew)
                        .bind(batch.clone())
                        .execute(&mut *c)
                        .await?;
                    sqlx::query_as(live).bind(batch).fetch_all(&mut *c).await
                })
            })
            .await;
        let renewed: std::collections::HashSet<(Vec<u8>, u64)> = match found {
            Ok(rows) => rows.into_iter().collect(),
            Err(e) => return batch_failed(e, grants.len()),
        };
        batch_answers(grants, sent, &self.config.client.safety_margin, |i, _| {
            rows.get(i).is_some_and(|(key, _, fence, _)| {
                renewed.contains(&(key.as_bytes().to_vec(), *fence))
            })
        })
    }
}
