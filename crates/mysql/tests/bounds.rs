//! Bounds against a frozen MariaDB (SIGSTOP: the server keeps its sockets and answers nothing):
//! every call returns within its caller's time plus one request, on a lane whose statement was
//! given up; once the server answers again, the lanes connect afresh, a lease that a late
//! acquisition took for nobody is given back, and leases work at once.

use std::time::{Duration, Instant};

use leasehold_core::Authority;

mod common;

use common::{connect, key, start_server, url, OrFail, Result};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_bounds_every_call_and_the_lanes_recover() -> Result {
    let server = start_server().await?;
    // Two lanes, so the calls below queue for a lane as well as for an answer.
    let a = connect(&format!("{}&pool_size=2", url(&server))).await?;
    a.migrate().await.or_fail("migrate")?;
    let (held, waited) = (key("frozen-held")?, key("frozen-waited")?);
    let ttl = Duration::from_secs(5);
    let grant = a
        .try_acquire(&held, ttl)
        .await
        .or_fail("acquire before the freeze")?
        .or_fail("a fresh key was held")?;
    {
        let s = server.clone();
        tokio::task::spawn_blocking(move || s.pause())
            .await
            .or_fail("the harness task")?
            .or_fail("pause the server")?;
    }
    let timeout = Duration::from_millis(1000);
    let slack = Duration::from_millis(400);
    let started = Instant::now();
    let calls = async {
        let a1 = a.acquire(&waited, ttl, Duration::from_millis(200));
        let a2 = a.try_acquire(&waited, ttl);
        let a3 = a.renew(&grant, ttl);
        let a4 = a.inspect(&held);
        tokio::join!(a1, a2, a3, a4)
    };
    let (acquired, tried, renewed, inspected) = calls.await;
    let took = started.elapsed();
    {
        let s = server.clone();
        tokio::task::spawn_blocking(move || s.resume())
            .await
            .or_fail("the harness task")?
            .or_fail("resume the server")?;
    }
    assert!(acquired.is_err(), "{acquired:?}");
    assert!(tried.is_err(), "{tried:?}");
    assert!(renewed.is_err(), "{renewed:?}");
    assert!(inspected.is_err(), "{inspected:?}");
    for retryable in [
        acquired.err().is_some_and(|e| e.is_retryable()),
        tried.err().is_some_and(|e| e.is_retryable()),
    ] {
        assert!(retryable, "an outage must be retryable");
    }
    // Each call is bounded by one request (the acquire's max_wait ends sooner), and they ran
    // side by side on two lanes; the lanes were given up with their statements, so the two
    // queued calls waited within their own time too.
    assert!(took < timeout + slack, "the calls took {took:?}");
    // The acquisitions sent into the frozen server were received, and run when it wakes: one
    // of them takes the key for nobody. Its answer is waited for on its own connection, and
    // the lease given back, so the key is free long before its TTL.
    let recovered = Instant::now();
    loop {
        if a.try_acquire(&waited, ttl)
            .await
            .or_fail("acquire after the resume")?
            .is_some()
        {
            break;
        }
        let after = recovered.elapsed();
        assert!(
            after < ttl / 2,
            "the key stayed held {after:?} after the resume: a late acquisition was not given back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.renew(&grant, ttl)
        .await
        .or_fail("the held lease renews after the resume")?;
    Ok(())
}
