//! Writes whose answer was lost, against a real etcd: a late delete must spare the next
//! contender under the same name, and a put that lands after its withdrawal is withdrawn again.

use super::*;
use leasehold_servers::EtcdServer;

/// Against a real etcd: acquisition 1's write got no answer, so the session
/// deletes its key without knowing its revision. One delete attempt is answered and the
/// name is freed; acquisition 2 of the same session reuses the name on the same lease; then
/// a duplicate of acquisition 1's delete arrives late. It must neither delete acquisition
/// 2's key (a delete compared by lease alone would: etcd #22082's pattern) nor erase its
/// booking (the key would then pass for an orphan).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_delete_of_an_unanswered_write_spares_the_next_contender(
) -> std::result::Result<(), String> {
    let server = tokio::task::spawn_blocking(EtcdServer::start)
        .await
        .map_err(|e| format!("the harness task: {e}"))?
        .map_err(|e| format!("etcd must start for this test: {e}"))?;
    let a = EtcdAuthority::connect(&format!("etcd://{}?timeout_ms=1000", server.endpoint()))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (client, timeout) = (a.client().clone(), a.timeout());
    let key = LockKey::new("late-delete").map_err(|e| e.to_string())?;
    let ttl = Duration::from_secs(2);
    let session = a
        .session(ttl)
        .await
        .map_err(|e| format!("the session: {e}"))?;
    let first = OwnerToken::generate().map_err(|e| e.to_string())?;
    let name = session
        .contenders
        .reserve(&a.prefix(&key), session.lease(), first)
        .ok_or("the session ended")?;
    // Acquisition 1's put landed, but its answer was lost.
    client
        .kv_client()
        .put(name.as_str(), first.to_hex(), Some(on_lease(&session)))
        .await
        .map_err(|e| format!("acquisition 1's put: {e}"))?;
    let late = session
        .contenders
        .withdraw(&name, first, None, deadline_in(timeout))
        .ok_or("nothing booked to withdraw")?;
    session
        .delete(&client, &late, timeout)
        .await
        .map_err(|e| format!("the answered delete: {e}"))?;

    let second = a
        .try_acquire(&key, ttl)
        .await
        .map_err(|e| format!("acquisition 2: {e}"))?
        .ok_or("acquisition 2: the key was held")?;
    let c = contender(&second).map_err(|e| format!("acquisition 2's contender key: {e}"))?;
    if c.name != name {
        return Err(format!("the freed name {name} was not reused: {}", c.name));
    }

    // The late duplicate of acquisition 1's delete.
    session
        .delete(&client, &late, timeout)
        .await
        .map_err(|e| format!("the late delete: {e}"))?;
    let found = client
        .kv_client()
        .get(name.as_str(), None)
        .await
        .map_err(|e| format!("reading the key: {e}"))?;
    if found.kvs().first().map(|kv| kv.create_revision()) != Some(c.revision) {
        return Err("the late delete removed the next contender's key".into());
    }
    if !session.contenders.is_held(&name, c.revision) {
        return Err("the late delete erased the next contender's booking".into());
    }
    a.renew(&second, ttl)
        .await
        .map_err(|e| format!("acquisition 2 is no longer held: {e}"))?;
    match a.release(&second).await {
        Ok(Released::Released) => Ok(()),
        other => Err(format!("releasing acquisition 2: {other:?}")),
    }
}

/// A write whose answer was lost may still land after its withdrawal was answered: held in
/// a member that was paused or cut off, it reaches the leader later. The withdrawal (a
/// delete by owner token) then finds nothing, and the key lands behind it on the session's
/// kept-alive lease, where it blocks every other client. Played here against the real
/// server: the late put is the same key, value and lease the acquire sent. The session must
/// delete it again within its recheck interval (a third of the TTL) plus one request, while
/// it holds another lock; and once it holds nothing else, it must revoke its lease (at its
/// next look, within a third of the TTL), after which no such put can land at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_that_lands_after_its_withdrawal_is_withdrawn_again(
) -> std::result::Result<(), String> {
    let server = tokio::task::spawn_blocking(EtcdServer::start)
        .await
        .map_err(|e| format!("the harness task: {e}"))?
        .map_err(|e| format!("etcd must start for this test: {e}"))?;
    let url = format!("etcd://{}?timeout_ms=1000", server.endpoint());
    let a = EtcdAuthority::connect(&url)
        .await
        .map_err(|e| format!("connect A: {e}"))?;
    let b = EtcdAuthority::connect(&url)
        .await
        .map_err(|e| format!("connect B: {e}"))?;
    let (client, timeout) = (a.client().clone(), a.timeout());
    let ttl = Duration::from_secs(6);
    let key = LockKey::new("late-put").map_err(|e| e.to_string())?;
    let other = LockKey::new("late-put-other").map_err(|e| e.to_string())?;
    // Another lock on the same session keeps it alive.
    let kept = a
        .try_acquire(&other, ttl)
        .await
        .map_err(|e| format!("A's other lock: {e}"))?
        .ok_or("A's other lock was held")?;
    let session = a
        .session(ttl)
        .await
        .map_err(|e| format!("A's session: {e}"))?;
    let owner = OwnerToken::generate().map_err(|e| e.to_string())?;
    let name = session
        .contenders
        .reserve(&a.prefix(&key), session.lease(), owner)
        .ok_or("the session ended")?;
    // The acquire's write got no answer: its key is withdrawn by owner token, and the
    // delete is answered before the put arrives, finding nothing.
    let withdrawal = session
        .contenders
        .withdraw(&name, owner, None, deadline_in(timeout))
        .ok_or("nothing booked to withdraw")?;
    session
        .delete(&client, &withdrawal, timeout)
        .await
        .map_err(|e| format!("the withdrawal: {e}"))?;
    // The put lands now.
    let landed = Instant::now();
    client
        .kv_client()
        .put(
            name.as_str(),
            stored::encode(owner, None),
            Some(on_lease(&session)),
        )
        .await
        .map_err(|e| format!("the late put: {e}"))?;
    // The doubtful key is looked at again a third of the TTL after its delete was
    // answered; that delete takes at most a request timeout, and so does B's try in flight.
    let bound = ttl / 3 + timeout * 2;
    let taken = loop {
        match b.try_acquire(&key, ttl).await {
            Ok(Some(grant)) => break grant,
            Ok(None) if landed.elapsed() < bound => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Ok(None) => {
                return Err(format!(
                    "B is still kept out {:?} after the late put landed (bound {bound:?})",
                    landed.elapsed()
                ))
            }
            Err(e) => return Err(format!("B's try: {e}")),
        }
    };
    eprintln!(
        "B took the key {:?} after the late put landed",
        landed.elapsed()
    );
    let released = b
        .release(&taken)
        .await
        .map_err(|e| format!("B's release: {e}"))?;
    if released != Released::Released {
        return Err(format!("B's release found {released:?}"));
    }

    // With nothing else held, the session ends and revokes its lease: a put on it now
    // cannot land.
    let owner = OwnerToken::generate().map_err(|e| e.to_string())?;
    let name = session
        .contenders
        .reserve(&a.prefix(&key), session.lease(), owner)
        .ok_or("the session ended too early")?;
    session.withdraw_later(&name, owner, None);
    let released = a
        .release(&kept)
        .await
        .map_err(|e| format!("A's release: {e}"))?;
    if released != Released::Released {
        return Err(format!("A's release found {released:?}"));
    }
    // The session looks at its book at least every third of the TTL (its doubt's next
    // delete is due by then), and the revoke takes one request.
    let revoked_by = Instant::now() + ttl / 3 + timeout * 2;
    loop {
        let ttl_left = client
            .lease_client()
            .time_to_live(session.lease(), None)
            .await
            .map_err(|e| format!("the session lease's TTL: {e}"))?
            .ttl();
        if ttl_left < 0 {
            break;
        }
        if Instant::now() > revoked_by {
            return Err(format!(
                "the session lease lives on ({ttl_left} s) with only a doubtful write booked"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let late = client
        .kv_client()
        .put(
            name.as_str(),
            stored::encode(owner, None),
            Some(on_lease(&session)),
        )
        .await;
    match late {
        Err(e) if errors::is_lease_not_found(&e) => Ok(()),
        other => Err(format!("a put on the revoked lease: {other:?}")),
    }
}
