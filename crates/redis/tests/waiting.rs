//! Waiters on a real Redis: an acquire that need not wait does not subscribe, waiters share one
//! subscription and retry silent holders with bounded backoff, a release wakes one waiter and
//! not all, a waiter whose attempt fails passes its turn on (as does a lease given back after a
//! failed attempt), and `Duration::MAX` waits without panicking.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::kit::{OrFail, TestResult};
use leasehold_conformance::Failure;
use leasehold_core::{Authority, Error, Grant, Instant, LockKey, Released, Revoked};
use leasehold_redis::RedisAuthority;
use leasehold_servers::RedisServer;

mod common;

use common::{calls, command, hand_off_rounds, median_under, raw, start, subscribers, url};

/// An `acquire` that finds the key free takes it without subscribing: once an authority's
/// subscription exists, every release announced on the channel is delivered to it, which cost
/// each uncontended pair 11 % on one core. The first caller that has to wait
/// subscribes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_need_not_wait_does_not_subscribe() -> TestResult {
    let server = start().await?;
    let a = Arc::new(
        RedisAuthority::connect(&url(&server))
            .await
            .or_fail("connect")?,
    );
    let mut con = raw(&server).await?;
    let key = LockKey::new("free").or_fail("the key")?;
    for _ in 0..3 {
        let grant = a
            .acquire(&key, Duration::from_secs(5), Duration::from_secs(1))
            .await
            .or_fail("acquire the free key")?;
        let _ = a.release(&grant).await.or_fail("release")?;
    }
    assert_eq!(subscribers(&mut con).await?, Some(redis::Value::Int(0)));

    let held = a
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .or_fail("acquire")?
        .or_fail("the key is free")?;
    let waiter = {
        let (a, key) = (a.clone(), key.clone());
        tokio::spawn(async move {
            a.acquire(&key, Duration::from_secs(5), Duration::from_secs(5))
                .await
        })
    };
    let up = Instant::now();
    while subscribers(&mut con).await? != Some(redis::Value::Int(1)) {
        assert!(
            up.elapsed() < Duration::from_secs(5),
            "the waiter never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = a.release(&held).await.or_fail("release")?;
    let grant = waiter
        .await
        .or_fail("the waiting task")?
        .or_fail("the waiter acquires")?;
    assert!(grant.fence() > held.fence());
    Ok(())
}

/// All waiters of an authority share one subscription connection. A holder that never
/// announces its end (a plain client's lease expiring) is found by retries whose backoff is
/// bounded: no waiter gets the key before the lease ends, and none spins meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_share_one_subscription_and_retry_silent_holders_with_bounded_backoff() -> TestResult
{
    let server = start().await?;
    let a = Arc::new(
        RedisAuthority::connect(&url(&server))
            .await
            .or_fail("connect")?,
    );
    let mut con = raw(&server).await?;
    let ttl = Duration::from_secs(5);
    let hold = Duration::from_millis(800);
    let keys = (0..5)
        .map(|i| LockKey::new(format!("silent-{i}")))
        .collect::<Result<Vec<_>, _>>()
        .or_fail("the keys")?;
    for key in &keys {
        let _: () = redis::cmd("SET")
            .arg(a.config().layout().lock_key(key))
            .arg("plain")
            .arg("PX")
            .arg(hold.as_millis() as u64)
            .query_async(&mut con)
            .await
            .or_fail("a plain holder's SET")?;
    }
    let (sha0, _) = calls(&server, "evalsha").await?;
    let started = Instant::now();
    let waiters: Vec<_> = keys
        .iter()
        .map(|key| {
            let (a, key) = (a.clone(), key.clone());
            tokio::spawn(async move {
                let g = a.acquire(&key, ttl, Duration::from_secs(5)).await;
                (g, started.elapsed())
            })
        })
        .collect();
    tokio::time::sleep(hold / 2).await;
    let numsub = subscribers(&mut con).await?;
    assert_eq!(
        numsub,
        Some(redis::Value::Int(1)),
        "one subscription for five waiters: {numsub:?}"
    );
    // A waiter's retry delays are at least 10, 20, 40, 75 ms, then 150 ms each (half of each
    // backoff step); add its first attempt, the one after the subscription came up and the one
    // at the holder's expiry.
    let mut most_attempts = 0;
    for w in waiters {
        let (g, at) = w.await.or_fail("a waiting task")?;
        g.or_fail("a waiter acquires")?;
        assert!(
            at >= hold - Duration::from_millis(50) && at < hold + Duration::from_millis(700),
            "got it after {at:?}"
        );
        most_attempts += 7 + at.as_millis() / 150;
    }
    let (sha1, _) = calls(&server, "evalsha").await?;
    println!("{} attempts by 5 waiters in {hold:?}", sha1 - sha0);
    assert!(
        u128::from(sha1 - sha0) <= most_attempts,
        "{} attempts by 5 waiters, more than their backoff allows ({most_attempts})",
        sha1 - sha0
    );
    drop(a);
    let dropped = Instant::now();
    loop {
        let numsub = subscribers(&mut con).await?;
        if numsub == Some(redis::Value::Int(0)) {
            break;
        }
        assert!(
            dropped.elapsed() < Duration::from_secs(2),
            "the subscription outlived its authority"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The most attempts a waiter's timer can make within `elapsed` once it waits: its backoff
/// delays are at least 10, 20, 40 and 75 ms, then 150 ms each (half of each step is fixed).
fn timer_attempts_within(elapsed: Duration) -> u64 {
    let mut at = Duration::ZERO;
    let mut attempts = 0;
    for step in [10, 20, 40, 75].into_iter().chain(std::iter::repeat(150)) {
        at = at.saturating_add(Duration::from_millis(step));
        if at > elapsed {
            return attempts + 1;
        }
        attempts += 1;
    }
    attempts
}

/// A release wakes one waiter of the key in this authority, not every one: 50 waiters take the
/// key in turn, each releasing it at once, and the attempts counted at the server (`EVALSHA` in
/// `INFO commandstats`) are one per hand-off plus the releases, within what the waiters' own
/// timers can add over the same time. Waking every waiter costs one attempt per remaining
/// waiter per hand-off (about 1,275 for the chain).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiter_not_all() -> TestResult {
    let server = start().await?;
    let a = Arc::new(
        RedisAuthority::connect(&url(&server))
            .await
            .or_fail("connect")?,
    );
    handoff_chain(&server, "handoff-50", vec![a; 50]).await
}

/// The same across processes: 24 authorities (each with its own subscription, as separate
/// processes have) wait on one key, and a release's announcement names one of them, so only
/// that one tries. Announced to all, every hand-off costs one attempt per waiting authority
/// (about 300 for the chain, and about 30 per hand-off with 32 processes on one key, measured).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiting_process_not_all() -> TestResult {
    let server = start().await?;
    let mut authorities = Vec::new();
    for _ in 0..24 {
        let authority = RedisAuthority::connect(&url(&server))
            .await
            .or_fail("connect")?;
        authorities.push(Arc::new(authority));
    }
    handoff_chain(&server, "handoff-24-processes", authorities).await
}

/// A waiting process reads only the hand-offs meant for it: a release that names a waiter in the
/// key's queue tells that waiter's authority on its own channel, and no waiting authority reads
/// the release channel, so the other processes are not woken by a hand-off they cannot use
/// (with every process reading every announcement, one key's throughput fell from 5,679 to 1,523
/// hand-offs a second from 2 to 32 processes). An observer in another authority still sees a
/// release that named a waiter, through the release channel its first observer subscribed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_processes_read_only_their_own_hand_offs() -> TestResult {
    const WAITERS: i64 = 8;
    let server = start().await?;
    let mut con = raw(&server).await?;
    let holder = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect the holder")?;
    let key = LockKey::new("own-channels").or_fail("the key")?;
    let ttl = Duration::from_secs(30);
    let first = holder
        .try_acquire(&key, ttl)
        .await
        .or_fail("the holder acquires")?
        .or_fail("the fresh key is held")?;
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        let a = RedisAuthority::connect(&url(&server))
            .await
            .or_fail("connect a waiter")?;
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let grant = a
                .acquire(&key, ttl, Duration::from_secs(60))
                .await
                .or_fail("a waiter acquires")?;
            match a.release(&grant).await {
                Ok(Released::Released) => Ok(()),
                other => Err(Failure::new(format!("a waiter's release: {other:?}"))),
            }
        }));
    }
    common::wait_subscribed(&mut con, WAITERS).await?;
    let readers = common::release_channel_readers(&mut con).await?;
    if readers != 0 {
        return Err(Failure::new(format!(
            "{readers} waiting authorities read the release channel, and with it every \
             hand-off of every process"
        )));
    }

    let observer = Arc::new(
        RedisAuthority::connect(&url(&server))
            .await
            .or_fail("connect the observer")?,
    );
    let max_wait = Duration::from_secs(30);
    let observed = {
        let (observer, key) = (observer.clone(), key.clone());
        tokio::spawn(async move {
            let since = Instant::now();
            observer
                .wait_for_change(&key, max_wait)
                .await
                .map(|()| since.elapsed())
        })
    };
    let since = Instant::now();
    while common::release_channel_readers(&mut con).await? != 1 {
        if since.elapsed() > Duration::from_secs(5) {
            return Err(Failure::new(
                "the observer's authority never subscribed to the release channel",
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Let the waiters' places stand in the queue, so that the release names one of them.
    let queue: i64 = redis::cmd("ZCARD")
        .arg("{leasehold:own-channels}:waiters")
        .query_async(&mut con)
        .await
        .or_fail("ZCARD the waiter queue")?;
    if queue == 0 {
        return Err(Failure::new("no waiter holds a place in the key's queue"));
    }
    match holder.release(&first).await {
        Ok(Released::Released) => {}
        other => return Err(Failure::new(format!("the holder's release: {other:?}"))),
    }
    let woke = observed
        .await
        .or_fail("the observing task")?
        .or_fail("wait_for_change")?;
    if woke >= max_wait / 2 {
        return Err(Failure::new(format!(
            "the observer woke after {woke:?}: a release that named a waiter did not reach it"
        )));
    }
    for task in tasks {
        task.await.or_fail("a waiting task")??;
    }
    Ok(())
}

/// An operator's revoke hands the key to a process waiting on it as a release does: the revoke
/// names the next waiter in the queue on its own channel, so the waiter holds the key within
/// milliseconds, not at its next retry (150 to 300 ms apart once it has waited a while). Median
/// of seven rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_hands_the_key_to_a_waiting_process_at_once() -> TestResult {
    let server = start().await?;
    let mut con = raw(&server).await?;
    let url = url(&server);
    let connect = || RedisAuthority::connect(&url);
    let holder = connect().await.or_fail("connect the holder")?;
    let operator = connect().await.or_fail("connect the operator")?;
    let waiter = Arc::new(connect().await.or_fail("connect the waiter")?);
    let key = LockKey::new("revoked-to-a-waiter").or_fail("the key")?;
    let ready = async || common::wait_subscribed(&mut con, 1).await;
    let revoke = async |_held: Grant| match operator.revoke(&key).await {
        Ok(Revoked::Revoked { .. }) => Ok(()),
        other => Err(Failure::new(format!("the revoke: {other:?}"))),
    };
    let latencies = hand_off_rounds(&holder, &waiter, &key, 7, ready, revoke).await?;
    median_under(&latencies, Duration::from_millis(30), "after a revoke")
}

/// One waiter per entry of `waiters` (its authority) takes `key` in turn, each releasing it at
/// once; the attempts counted at the server must be one per hand-off (two where an
/// announcement arrives after the woken waiter's attempt), plus the releases and what the
/// waiters' own timers can add.
async fn handoff_chain(
    server: &Arc<RedisServer>,
    key: &str,
    waiters: Vec<Arc<RedisAuthority>>,
) -> TestResult {
    let count = waiters.len() as u64;
    let holder = RedisAuthority::connect(&url(server))
        .await
        .or_fail("connect")?;
    let key = LockKey::new(key).or_fail("the key")?;
    let ttl = Duration::from_secs(30);
    let first = holder
        .try_acquire(&key, ttl)
        .await
        .or_fail("holder")?
        .or_fail("the fresh key is held")?;
    let (sha0, _) = calls(server, "evalsha").await?;
    let started = Instant::now();
    let waiters: Vec<_> = waiters
        .into_iter()
        .map(|a| {
            let key = key.clone();
            tokio::spawn(async move {
                let grant = a
                    .acquire(&key, ttl, Duration::from_secs(120))
                    .await
                    .or_fail("acquire")?;
                match a.release(&grant).await {
                    Ok(Released::Released) => Ok(()),
                    other => Err(Failure::new(format!("the waiter's release: {other:?}"))),
                }
            })
        })
        .collect();
    // Every waiter is waiting once it made its first attempt and the one after subscribing.
    loop {
        let (sha, _) = calls(server, "evalsha").await?;
        if sha - sha0 >= 2 * count {
            break;
        }
        if started.elapsed() > Duration::from_secs(20) {
            return Err(Failure::new(format!(
                "only {} attempts by {count} waiters",
                sha - sha0
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match holder.release(&first).await {
        Ok(Released::Released) => {}
        other => return Err(Failure::new(format!("the holder's release: {other:?}"))),
    }
    for waiter in waiters {
        waiter.await.or_fail("a waiting task")??;
    }
    let elapsed = started.elapsed();
    let (sha1, _) = calls(server, "evalsha").await?;
    let spent = sha1 - sha0;
    // Per waiter: two attempts before it waits, its timer's, and its release; per hand-off:
    // the woken waiter's attempt and one more woken by the same release's announcement when
    // it arrives after that attempt ended; the holder's release.
    let allowed = count * (3 + timer_attempts_within(elapsed)) + 2 * count + 1;
    println!(
        "{spent} EVALSHA for {count} hand-offs in {elapsed:?} ({:.1} per hand-off beyond the \
         waiters' first two attempts and their releases); allowed {allowed}",
        spent.saturating_sub(3 * count + 1) as f64 / count as f64
    );
    if spent > allowed {
        return Err(Failure::new(format!(
            "{spent} EVALSHA for {count} hand-offs in {elapsed:?}: more than one attempt per \
             hand-off and the waiters' timers allow ({allowed})"
        )));
    }
    Ok(())
}

/// Three rounds of: the authority `a` holds `key`, two of its waiters wait until their backoff
/// is at its cap, the fence counter is set to `poison` so that every attempt fails, and the
/// holder releases. Nothing but the authority itself wakes its waiters: its ACL user has no
/// channel rights (releases are not announced, the subscription is refused), so the release
/// wakes them through the authority alone. Both waiters must end with an error `expected`
/// accepts within 100 ms of the release: two thirds of the shortest delay of a grown backoff
/// (150 ms), so a waiter left to its timer, ending at a random point of its 150-300 ms step,
/// is inside the bound less than half the time in each round.
async fn failing_waiters_end_at_once(
    server: &Arc<RedisServer>,
    poison: &str,
    expected: fn(&Error) -> bool,
) -> TestResult {
    command(
        server,
        &["ACL", "SETUSER", "mute", "on", ">mute-pw", "~*", "+@all"],
    )
    .await?;
    let acl_url = format!(
        "redis://mute:mute-pw@127.0.0.1:{}?timeout_ms=1000",
        server.port()
    );
    let a = Arc::new(RedisAuthority::connect(&acl_url).await.or_fail("connect")?);
    let key = LockKey::new("failing-waiters").or_fail("the key")?;
    let ttl = Duration::from_secs(30);
    let bound = Duration::from_millis(100);
    let fence_key = a.config().layout().fence_key(&key);
    for round in 1..=3 {
        command(server, &["SET", &fence_key, "1"]).await?;
        // The previous round's winning waiters give their leases back in the background, so
        // the key may still be held for a moment when the round starts.
        let freed = Instant::now();
        let held = loop {
            if let Some(held) = a.try_acquire(&key, ttl).await.or_fail("the holder")? {
                break held;
            }
            if freed.elapsed() > Duration::from_secs(5) {
                return Err(Failure::new(format!(
                    "round {round}: the key is still held 5 s after the previous round's \
                     leases were given back"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        command(server, &["SET", &fence_key, poison]).await?;
        let (sha0, _) = calls(server, "evalsha").await?;
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (a, key) = (a.clone(), key.clone());
                tokio::spawn(async move {
                    let answer = a.acquire(&key, ttl, Duration::from_secs(60)).await;
                    (answer, Instant::now())
                })
            })
            .collect();
        // Each waiter's first two attempts and five timer attempts: its backoff (steps of 20,
        // 40, 80, 160 and 300 ms) is then at its cap.
        let started = Instant::now();
        loop {
            let (sha, _) = calls(server, "evalsha").await?;
            if sha - sha0 >= 2 * 7 {
                break;
            }
            if started.elapsed() > Duration::from_secs(20) {
                return Err(Failure::new(format!(
                    "the waiters made only {} attempts",
                    sha - sha0
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let released = Instant::now();
        match a.release(&held).await {
            Ok(Released::Released) => {}
            other => return Err(Failure::new(format!("the holder's release: {other:?}"))),
        }
        for waiter in waiters {
            let (answer, ended) = tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .or_fail("a waiter was never woken")?
                .or_fail("a waiting task")?;
            let after = ended.saturating_duration_since(released);
            match answer {
                Err(e) if expected(&e) && after < bound => {}
                other => {
                    return Err(Failure::new(format!(
                        "round {round}: a waiter ended {after:?} after the release with \
                         {other:?}; expected its error within {bound:?}"
                    )))
                }
            }
        }
    }
    Ok(())
}

/// A release hands the key's turn to one waiter of the authority; one whose attempt then fails
/// (here the acquire script finds the counter is no integer, and takes nothing) passes the turn
/// on, so the next waiter tries at once rather than at its timer. Without the passing on, a
/// waiter ended 151 and 158 ms after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_attempt_fails_passes_its_turn_on() -> TestResult {
    let server = start().await?;
    failing_waiters_end_at_once(&server, "not a number", |e| {
        matches!(
            e,
            Error::Backend {
                retryable: false,
                ..
            }
        )
    })
    .await
}

/// An attempt that won but cannot use its grant (its fence out of range) gives the lease back
/// in the background; that give-back wakes this authority's waiters as a release does, since
/// the waiter handed the turn next may have found the lease not yet given back, and no
/// announcement follows where publishing is refused. Without that wake-up the second waiter
/// ends at its timer in some runs (174 to 215 ms after the release; one to two runs of three).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_given_back_after_a_failed_attempt_wakes_the_next_waiter() -> TestResult {
    let server = start().await?;
    let largest = ((1u64 << 48) - 1).to_string();
    failing_waiters_end_at_once(&server, &largest, |e| {
        matches!(e, Error::FenceOutOfRange { .. })
    })
    .await
}

/// `Duration::MAX` is how a caller says "wait forever". It must not panic (`Instant +
/// Duration` overflows): on a free key it acquires at once, and on a held key it waits until
/// the holder releases, against a real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_with_duration_max_waits_forever_without_panicking() -> TestResult {
    let server = start().await?;
    let a = Arc::new(
        RedisAuthority::connect(&url(&server))
            .await
            .or_fail("connect A")?,
    );
    let holder = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect the holder")?;
    let key = LockKey::new("forever").or_fail("the key")?;
    let ttl = Duration::from_secs(10);

    let free = tokio::spawn({
        let (a, key) = (a.clone(), key.clone());
        async move { a.acquire(&key, ttl, Duration::MAX).await }
    })
    .await
    .or_fail("acquire on a free key with max_wait = Duration::MAX panicked")?
    .or_fail("acquire on a free key with max_wait = Duration::MAX")?;
    assert_eq!(
        a.release(&free).await.or_fail("release")?,
        Released::Released
    );

    let held = holder
        .try_acquire(&key, ttl)
        .await
        .or_fail("the holder acquires")?
        .or_fail("the key is free")?;
    let waiter = tokio::spawn({
        let (a, key) = (a.clone(), key.clone());
        async move { a.acquire(&key, ttl, Duration::MAX).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the waiter got a held key");
    let released_at = Instant::now();
    assert_eq!(
        holder.release(&held).await.or_fail("the holder releases")?,
        Released::Released
    );
    // The release is announced: the waiter holds the key long before the holder's TTL would
    // have ended (half of it leaves room for a loaded machine).
    let got = tokio::time::timeout(ttl / 2, waiter)
        .await
        .or_fail("the waiter missed the release")?
        .or_fail("acquire on a held key with max_wait = Duration::MAX panicked")?
        .or_fail("the waiter acquires")?;
    assert!(got.fence() > held.fence());
    println!("hand-off with max_wait = MAX: {:?}", released_at.elapsed());
    assert_eq!(
        a.release(&got).await.or_fail("A releases")?,
        Released::Released
    );
    Ok(())
}
