//! Writes whose answer is lost: the store applied them, the client never heard. A proxy in
//! front of moto (started by the harness) forwards requests but, while told to, drops the
//! connection instead of relaying the store's answer, so the authority gets an error for a
//! write that landed. The next step must recognise its own write (owner, fence) and go on,
//! never take it for someone else's.
#![cfg(feature = "aws")]

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};
use leasehold_conformance::Failure;
use leasehold_core::{Authority, LockKey, OwnerToken, Released};
use object_store::ObjectStoreExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Forwards 127.0.0.1:<port> to `target`; while `lose` is set, the store's answers to `PUT`
/// requests are read and thrown away, and the client's connection is closed instead (reads
/// pass, so a step can read, decide and write, and only its write's answer is lost).
async fn losing_proxy(target: u16, lose: Arc<AtomicBool>) -> std::io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let lose = lose.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                    return;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                // The method of the request in flight on this connection (the client writes
                // each request's head in one piece).
                let put = Arc::new(AtomicBool::new(false));
                let upstream = {
                    let put = put.clone();
                    tokio::spawn(async move {
                        let mut buffer = vec![0u8; 16 * 1024];
                        while let Ok(n) = client_read.read(&mut buffer).await {
                            if n == 0 {
                                break;
                            }
                            let chunk = &buffer[..n];
                            if chunk.starts_with(b"PUT ") {
                                put.store(true, Ordering::SeqCst);
                            } else if [&b"GET "[..], b"HEAD ", b"POST ", b"DELETE "]
                                .iter()
                                .any(|m| chunk.starts_with(m))
                            {
                                put.store(false, Ordering::SeqCst);
                            }
                            if server_write.write_all(chunk).await.is_err() {
                                break;
                            }
                        }
                    })
                };
                let mut buffer = vec![0u8; 16 * 1024];
                while let Ok(n) = server_read.read(&mut buffer).await {
                    if n == 0 || (lose.load(Ordering::SeqCst) && put.load(Ordering::SeqCst)) {
                        break;
                    }
                    if client_write.write_all(&buffer[..n]).await.is_err() {
                        break;
                    }
                }
                upstream.abort();
            });
        }
    });
    Ok(port)
}

fn key(name: &str) -> TestResult<LockKey> {
    let run = OwnerToken::generate().or_fail("a run id")?.to_hex();
    LockKey::new(format!("lost-answers/{}/{name}", &run[..12])).or_fail("a key")
}

/// The sequence number the object holds now (read past the authority).
async fn seq_of(store: &dyn object_store::ObjectStore, key: &LockKey) -> TestResult<u64> {
    let body = store
        .get(&support::lease_path(key))
        .await
        .or_fail("read the object")?
        .bytes()
        .await
        .or_fail("read its body")?;
    let record: serde_json::Value = serde_json::from_slice(&body).or_fail("its JSON")?;
    record["seq"].as_u64().or_fail("its seq")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_whose_answer_was_lost_is_recognised_as_the_holders_own() -> TestResult {
    let moto = support::shared_moto().await?;
    let lose = Arc::new(AtomicBool::new(false));
    let port = losing_proxy(moto.port(), lose.clone())
        .await
        .or_fail("a proxy in front of moto")?;
    let through_proxy = format!("http://127.0.0.1:{port}");
    let direct = moto.url();
    let holder = support::Clients::new(move || support::s3(&through_proxy), support::config())
        .authority()?;
    let others = support::Clients::new(move || support::s3(&direct), support::config());
    let (contender, store) = (others.authority()?, others.store()?);
    let key = key("renewal")?;
    let ttl = Duration::from_secs(4);
    let grant = holder
        .try_acquire(&key, ttl)
        .await
        .or_fail("acquire")?
        .or_fail("the key was free")?;
    let before = seq_of(&*store, &key).await?;
    lose.store(true, Ordering::SeqCst);
    let unknown = holder
        .renew(&grant, ttl)
        .await
        .err_or_fail("a renewal whose answer is lost")?;
    lose.store(false, Ordering::SeqCst);
    if !unknown.is_retryable() || unknown.is_lease_lost() {
        return Err(Failure::new(format!(
            "a lost answer must be a retryable error, not a loss: {unknown}"
        )));
    }
    let landed = seq_of(&*store, &key).await?;
    if landed <= before {
        return Err(Failure::new(format!(
            "the renewal never reached moto (seq {before} -> {landed}): the test proves nothing"
        )));
    }
    holder
        .renew(&grant, ttl)
        .await
        .or_fail("the next renewal, over the write whose answer was lost")?;
    if contender
        .try_acquire(&key, ttl)
        .await
        .or_fail("a contender's try")?
        .is_some()
    {
        return Err(Failure::new("a contender took the renewed key"));
    }
    if holder.release(&grant).await.or_fail("release")? != Released::Released {
        return Err(Failure::new("the holder could not release its own lease"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_whose_answer_was_lost_holds_until_its_ttl_ends() -> TestResult {
    let moto = support::shared_moto().await?;
    let lose = Arc::new(AtomicBool::new(true));
    let port = losing_proxy(moto.port(), lose.clone())
        .await
        .or_fail("a proxy in front of moto")?;
    let through_proxy = format!("http://127.0.0.1:{port}");
    let direct = moto.url();
    let lost = support::Clients::new(move || support::s3(&through_proxy), support::config())
        .authority()?;
    let contender =
        support::Clients::new(move || support::s3(&direct), support::config()).authority()?;
    let key = key("acquire")?;
    let ttl = Duration::from_secs(2);
    let unknown = lost
        .try_acquire(&key, ttl)
        .await
        .err_or_fail("an acquisition whose answers are lost")?;
    if !unknown.is_retryable() {
        return Err(Failure::new(format!("not retryable: {unknown}")));
    }
    lose.store(false, Ordering::SeqCst);
    // The write landed: the key is held by an owner nobody knows, until its TTL ends.
    if contender
        .try_acquire(&key, ttl)
        .await
        .or_fail("a contender's first try")?
        .is_some()
    {
        return Err(Failure::new(
            "the key was free: the lost acquisition never reached moto, the test proves nothing",
        ));
    }
    let taken = contender
        .acquire(&key, ttl, Duration::from_secs(10))
        .await
        .or_fail("the key must be free once the lost write's TTL ends")?;
    if taken.fence().raw() != 2 {
        return Err(Failure::new(format!(
            "the takeover's fence is {:?}, not the one after the lost acquisition's",
            taken.fence()
        )));
    }
    let _ = contender.release(&taken).await.or_fail("release")?;
    Ok(())
}
