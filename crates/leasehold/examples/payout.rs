//! A payout done right, as the seed tells it: durable intent, an idempotency key, guarded
//! transitions, and reconciliation, on PostgreSQL.
//!
//! ```text
//! cargo run -p leasehold --features postgres --example payout -- postgres://user@host/db [ROUNDS] [SEED] [unfenced]
//! ```
//!
//! The failure the seed describes: worker A holds the lease and calls the payment provider; the
//! provider moves the money but answers too late, A's call times out and A freezes past its
//! lease. Worker B takes over and retries. With a lock alone that is two payouts. Here:
//!
//! * the payout row records the **intent** before the side effect (`PENDING` -> `SUBMITTING`),
//!   so whoever comes next knows a submission may have happened;
//! * `provider_key` is derived **once** from the payout id and sent on every attempt, so the
//!   provider (which honours idempotency keys) pays once however often it is asked;
//! * every transition is a **guarded** update (`last_fence`), so A's late write is refused;
//! * a **reconciliation** job looks rows stuck in `SUBMITTING` up at the provider by key.
//!
//! The idempotency key alone keeps the money moving once. What only the fence guards is the
//! row: in some rounds the provider *declines* A's call (a decline that keeps no record of the
//! key, so a retry may still pay), A freezes past its lease, B retries with the same key and is
//! paid, and A then records `FAILED`, a transition a payout may take after `SUBMITTED` (a
//! returned transfer). Without the fence A's late `FAILED` would overwrite B's `SUBMITTED`: the
//! row would say the payout failed while the money moved.
//!
//! Each round runs A, B and the reconciler with seeded timings (does the provider answer late,
//! or decline? does B start before or after A's lease ends? does the reconciler come first?).
//! The example exits non-zero unless every payout moved money at most once and its row says
//! what the provider did: `SUBMITTED` with one transfer, or `FAILED` with none. A fourth
//! argument `unfenced` runs the same transitions without the fence check, to show what the
//! fence is for (it then fails).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use leasehold::postgres::guarded::{Claimed, FencedTable, Guarded};
use leasehold::postgres::PostgresAuthority;
use leasehold::{Authority, LockKey};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::{AssertSqlSafe, PgConnection, PgPool, SqlSafeStr};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The stand-in payment provider: pays once per idempotency key, and can answer late.
#[derive(Default)]
struct Provider {
    /// provider_key -> the provider's reference of the one payout made for it.
    paid: Mutex<HashMap<String, String>>,
    /// Money actually moved, per payout id: what "exactly once" is about.
    transfers: Mutex<HashMap<String, u32>>,
}

impl Provider {
    /// Pays (once per key) and then answers after `answer_after`; a caller that gives up before
    /// that sees a timeout although the money moved. With `decline`, moves nothing, keeps no
    /// record of the key (a later call with it may pay) and answers `Err` after `answer_after`.
    async fn pay(
        &self,
        payout: &str,
        provider_key: &str,
        answer_after: Duration,
        decline: bool,
    ) -> Result<String, String> {
        if decline {
            tokio::time::sleep(answer_after).await;
            return Err(format!("declined {provider_key}"));
        }
        let reference = {
            let mut paid = self.paid.lock().unwrap();
            paid.entry(provider_key.to_string())
                .or_insert_with(|| {
                    *self
                        .transfers
                        .lock()
                        .unwrap()
                        .entry(payout.to_string())
                        .or_default() += 1;
                    format!("tr_{provider_key}")
                })
                .clone()
        };
        tokio::time::sleep(answer_after).await;
        Ok(reference)
    }

    /// The reconciler's lookup by idempotency key.
    fn lookup(&self, provider_key: &str) -> Option<String> {
        self.paid.lock().unwrap().get(provider_key).cloned()
    }

    fn transfers(&self, payout: &str) -> u32 {
        self.transfers
            .lock()
            .unwrap()
            .get(payout)
            .copied()
            .unwrap_or(0)
    }
}

/// What one worker's attempt did, for the log.
type Said = Vec<String>;

struct Shop {
    authority: PostgresAuthority,
    pool: PgPool,
    payouts: FencedTable,
    provider: Provider,
    ttl: Duration,
    /// Whether transitions check the fence (`false` only to show what it is for).
    fenced: bool,
}

impl Shop {
    /// A guarded transition of payout `id` ([`FencedTable::update`]); unfenced, the same
    /// transition with the fence recorded but not compared.
    async fn transition(
        &self,
        conn: &mut PgConnection,
        id: &str,
        fence: leasehold::Fence,
        set: &'static str,
        precondition: &'static str,
        reference: Option<&str>,
    ) -> Result<Guarded, BoxError> {
        if self.fenced {
            return Ok(self
                .payouts
                .update(conn, id, fence, set, precondition, |q| match reference {
                    Some(r) => q.bind(r.to_string()),
                    None => q,
                })
                .await?);
        }
        let sql = format!(
            "UPDATE payouts SET {set}, last_fence = GREATEST(last_fence, $2) \
             WHERE id = $1 AND ({precondition})"
        );
        let query = sqlx::query(AssertSqlSafe(sql).into_sql_str())
            .bind(id.to_string())
            .bind(fence.as_i64());
        let query = match reference {
            Some(r) => query.bind(r.to_string()),
            None => query,
        };
        let done = query.execute(&mut *conn).await?;
        Ok(if done.rows_affected() > 0 {
            Guarded::Applied
        } else {
            Guarded::PreconditionFailed
        })
    }

    /// One attempt under a lease: claim the row with the fence, record the intent, call the
    /// provider with the payout's key (giving up after `patience`), record the result.
    /// `freeze` is how long the worker stalls after the provider call, as a GC pause would;
    /// `declined` makes the provider decline this call.
    #[allow(clippy::too_many_arguments)]
    async fn attempt(
        &self,
        who: &str,
        id: &str,
        wait: Duration,
        provider_late_by: Duration,
        declined: bool,
        freeze: Duration,
        said: &Mutex<Said>,
    ) -> Result<(), BoxError> {
        let say = |what: String| said.lock().unwrap().push(format!("{who}: {what}"));
        let key = LockKey::new(format!("payout:{id}"))?;
        let grant = match self.authority.acquire(&key, self.ttl, wait).await {
            Ok(g) => g,
            Err(leasehold::Error::Timeout { .. }) => {
                say("the payout is locked by someone else; leaving it".into());
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        let fence = grant.fence();
        let mut conn = self.pool.acquire().await?;
        let row: Claimed<(String, String)> = self
            .payouts
            .claim(&mut conn, id, fence, "state, provider_key")
            .await?;
        let (state, provider_key) = match row {
            Claimed::Claimed(row) => row,
            other => {
                say(format!("could not claim the row ({other:?})"));
                return Ok(());
            }
        };
        if state == "SUBMITTED" {
            say(format!("fence {fence}: already SUBMITTED, nothing to do"));
            let _ = self.authority.release(&grant).await;
            return Ok(());
        }
        // Durable intent first: from here on a submission may have happened.
        let intent = self
            .transition(
                &mut conn,
                id,
                fence,
                "state = 'SUBMITTING'",
                "state IN ('PENDING', 'SUBMITTING')",
                None,
            )
            .await?;
        if intent != Guarded::Applied {
            say(format!("fence {fence}: intent not recorded ({intent:?})"));
            return Ok(());
        }
        say(format!(
            "fence {fence}: SUBMITTING, calling the provider with key {provider_key}"
        ));
        let patience = self.ttl / 2;
        let answer = tokio::time::timeout(
            patience,
            self.provider
                .pay(id, &provider_key, provider_late_by, declined),
        )
        .await;
        tokio::time::sleep(freeze).await;
        let reference = match answer {
            Err(_) => {
                say(format!(
                    "fence {fence}: the provider did not answer within {patience:?}; outcome \
                     unknown, the row stays SUBMITTING"
                ));
                return Ok(());
            }
            Ok(Err(declined)) => {
                // A payout may fail after it was submitted (a returned transfer), so FAILED
                // may follow SUBMITTED: only the fence tells this late answer from that.
                let before = self.state(&mut conn, id).await?;
                let failed = self
                    .transition(
                        &mut conn,
                        id,
                        fence,
                        "state = 'FAILED'",
                        "state IN ('SUBMITTING', 'SUBMITTED')",
                        None,
                    )
                    .await?;
                match failed {
                    Guarded::Applied if before == "SUBMITTED" => say(format!(
                        "fence {fence}: the provider {declined}; FAILED recorded over SUBMITTED"
                    )),
                    Guarded::Applied => {
                        say(format!("fence {fence}: the provider {declined}; FAILED"))
                    }
                    Guarded::Stale { newest } => say(format!(
                        "fence {fence}: the provider {declined}; stale FAILED REFUSED, a newer \
                         holder (fence {newest}) owns the payout"
                    )),
                    other => say(format!("fence {fence}: FAILED not recorded ({other:?})")),
                }
                let _ = self.authority.release(&grant).await;
                return Ok(());
            }
            Ok(Ok(reference)) => reference,
        };
        let done = self
            .transition(
                &mut conn,
                id,
                fence,
                "state = 'SUBMITTED', provider_ref = $3",
                "state = 'SUBMITTING'",
                Some(&reference),
            )
            .await?;
        match done {
            Guarded::Applied => say(format!("fence {fence}: SUBMITTED ({reference})")),
            Guarded::Stale { newest } => say(format!(
                "fence {fence}: result REFUSED, a newer holder (fence {newest}) owns the payout"
            )),
            other => say(format!("fence {fence}: result not recorded ({other:?})")),
        }
        let _ = self.authority.release(&grant).await;
        Ok(())
    }

    /// The payout's state now.
    async fn state(&self, conn: &mut PgConnection, id: &str) -> Result<String, BoxError> {
        let (state,): (String,) = sqlx::query_as("SELECT state FROM payouts WHERE id = $1")
            .bind(id)
            .fetch_one(&mut *conn)
            .await?;
        Ok(state)
    }

    /// Reconciliation: rows stuck in SUBMITTING are looked up at the provider by key; found
    /// ones are marked SUBMITTED, the rest retried with the same key (which cannot pay twice).
    async fn reconcile(&self, id: &str, said: &Mutex<Said>) -> Result<(), BoxError> {
        let stuck: Option<(String,)> = sqlx::query_as(
            "SELECT provider_key FROM payouts WHERE id = $1 AND state = 'SUBMITTING'",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        let Some((provider_key,)) = stuck else {
            return Ok(());
        };
        let found = self.provider.lookup(&provider_key);
        said.lock().unwrap().push(format!(
            "reconciler: {id} stuck in SUBMITTING; the provider {} key {provider_key}",
            if found.is_some() {
                "knows"
            } else {
                "does not know"
            }
        ));
        self.attempt(
            "reconciler",
            id,
            self.ttl * 4,
            Duration::ZERO,
            false,
            Duration::ZERO,
            said,
        )
        .await
    }
}

async fn round(shop: &Shop, rng: &mut StdRng, n: u32) -> Result<(bool, Said), BoxError> {
    let id = format!("po_{}_{n}", std::process::id());
    // The idempotency key is derived once, when the payout is created, and never again.
    let provider_key = format!("pk_{id}");
    sqlx::query(
        "INSERT INTO payouts (id, amount_cents, state, provider_key) VALUES ($1, 2500, 'PENDING', $2)",
    )
    .bind(&id)
    .bind(&provider_key)
    .execute(&shop.pool)
    .await?;
    let ttl = shop.ttl;
    // A pause past the lease, varied per round by the seeded generator: the provider late or
    // on time, declining or paying, the next worker early or late.
    let late_by = if rng.random_bool(0.8) {
        ttl
    } else {
        Duration::ZERO
    };
    let freeze = ttl * rng.random_range(1..=3);
    let b_after = ttl / 4 * rng.random_range(0..=8);
    let reconciler_first = rng.random_bool(0.3);
    // The provider declines A's call at once, and A freezes before recording it.
    let a_declined = rng.random_bool(0.3);
    let late_by = if a_declined { Duration::ZERO } else { late_by };
    let said = Mutex::new(Said::new());
    let a = shop.attempt(
        "worker A",
        &id,
        Duration::ZERO,
        late_by,
        a_declined,
        freeze,
        &said,
    );
    let b = async {
        tokio::time::sleep(b_after).await;
        if reconciler_first {
            shop.reconcile(&id, &said).await
        } else {
            shop.attempt(
                "worker B",
                &id,
                ttl * 4,
                Duration::ZERO,
                false,
                Duration::ZERO,
                &said,
            )
            .await
        }
    };
    let (ra, rb) = tokio::join!(a, b);
    ra?;
    rb?;
    // The reconciler's regular pass, after everyone.
    shop.reconcile(&id, &said).await?;
    let (state,): (String,) = sqlx::query_as("SELECT state FROM payouts WHERE id = $1")
        .bind(&id)
        .fetch_one(&shop.pool)
        .await?;
    let transfers = shop.provider.transfers(&id);
    let mut said = said.into_inner().unwrap();
    said.push(format!(
        "{id}: {state}, {transfers} transfer(s) at the provider"
    ));
    // The row must say what the provider did.
    let right = matches!(
        (state.as_str(), transfers),
        ("SUBMITTED", 1) | ("FAILED", 0)
    );
    Ok((right, said))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .ok_or("usage: payout <postgres://...> [ROUNDS] [SEED]")?;
    let rounds: u32 = args.next().map(|r| r.parse()).transpose()?.unwrap_or(1);
    let seed: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(2026);
    let fenced = match args.next().as_deref() {
        None => true,
        Some("unfenced") => false,
        Some(other) => return Err(format!("unknown mode `{other}` (only `unfenced`)").into()),
    };
    let authority = PostgresAuthority::connect(&url).await?;
    authority.migrate().await?;
    let pool = authority.pool().clone();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS payouts (id text PRIMARY KEY, amount_cents bigint NOT NULL, \
         state text NOT NULL CHECK (state IN ('PENDING', 'SUBMITTING', 'SUBMITTED', 'FAILED')), \
         provider_key text NOT NULL UNIQUE, provider_ref text, \
         last_fence bigint NOT NULL DEFAULT 0)",
    )
    .execute(&pool)
    .await?;
    let shop = Shop {
        authority,
        pool,
        payouts: FencedTable::new("payouts", "id")?,
        provider: Provider::default(),
        ttl: Duration::from_millis(400),
        fenced,
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut wrong, mut late, mut refused, mut retried, mut stale_failed) = (0, 0, 0, 0, 0);
    for n in 0..rounds {
        let (once, said) = round(&shop, &mut rng, n).await?;
        let has = |what: &str| said.iter().any(|l| l.contains(what));
        late += u32::from(has("did not answer within"));
        refused += u32::from(has("result REFUSED"));
        stale_failed += u32::from(has("stale FAILED REFUSED"));
        retried += u32::from(
            said.iter()
                .filter(|l| l.contains("calling the provider"))
                .count()
                > 1,
        );
        if rounds == 1 || !once {
            for line in &said {
                println!("{line}");
            }
        }
        if !once {
            wrong += 1;
            println!("round {n}: WRONG (the row does not say what the provider did, or money moved twice)");
        }
    }
    println!(
        "\n{rounds} round(s), seed {seed}{}: the provider answered too late in {late}, a stale \
         result was refused by the fence in {refused}, a stale FAILED was refused by the fence \
         in {stale_failed}, the payout was retried with the same key in {retried}; {} right \
         (paid exactly once, or FAILED with nothing paid)",
        if fenced { "" } else { ", unfenced" },
        rounds - wrong
    );
    if wrong == 0 {
        println!("every payout made exactly once, or FAILED with nothing paid.");
        Ok(())
    } else {
        Err(format!("{wrong} payout row(s) wrong").into())
    }
}
