//! Values a grant proclaims on etcd, against a real server: a stale grant's proclaim is refused
//! and spares the holder's value; every byte value round-trips.

use std::time::Duration;

use etcd_client::Client;
use leasehold_core::{Authority, Error, OwnerId, Released, MAX_VALUE_LEN};
use leasehold_etcd::guarded::contender_key;

mod common;

use common::{connect, key, keys_under, raw_client, start, url, OrFail, Result};

/// Whether `result` is the refusal a grant that is no longer ours gets.
fn refused(result: &leasehold_core::Result<()>) -> bool {
    matches!(result, Err(Error::LeaseLost { .. }))
}

/// A grant's proclaim is conditional on its key: a stale grant (released, then the same
/// session's next grant reusing its key's name, as in etcd #22082; or its key deleted behind its
/// back and another client holding the lock) is refused with `LeaseLost` and the current
/// holder's value is left as it was. A new grant starts with no value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_proclaim_is_refused_and_spares_the_holders_value() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let a = connect(&url(&server)).await?;
    let b = connect(&url(&server)).await?;
    // Long enough that no grant here is withdrawn unrenewed while the test runs.
    let ttl = Duration::from_secs(10);
    let key = key("proclaim/stale")?;
    let value = |seen: &leasehold_core::Inspection| seen.value.clone();

    let first = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("A's first grant")?
        .or_fail("a free key")?;
    a.proclaim(&first, b"a-1")
        .await
        .or_fail("A's first proclaim")?;
    let seen = b.inspect(&key).await.or_fail("B inspects")?;
    assert_eq!(value(&seen), Some(b"a-1".to_vec()));
    assert_eq!(seen.fence, Some(first.fence()));
    assert_eq!(seen.owner, Some(OwnerId::of(&first.owner())));

    // Released, then the same session takes the key again under the same name.
    assert_eq!(
        a.release(&first).await.or_fail("A's first release")?,
        Released::Released
    );
    let second = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("A's second grant")?
        .or_fail("free again")?;
    assert_eq!(
        contender_key(&first).or_fail("the first contender key")?,
        contender_key(&second).or_fail("the second contender key")?
    );
    assert_eq!(
        value(&b.inspect(&key).await.or_fail("B inspects")?),
        None,
        "a new grant starts with no value"
    );
    let stale = a.proclaim(&first, b"stale").await;
    assert!(refused(&stale), "{stale:?}");
    assert_eq!(value(&b.inspect(&key).await.or_fail("B inspects")?), None);
    a.proclaim(&second, b"a-2")
        .await
        .or_fail("A's second proclaim")?;
    let stale = a.proclaim(&first, b"stale").await;
    assert!(refused(&stale), "{stale:?}");
    assert_eq!(
        value(&b.inspect(&key).await.or_fail("B inspects")?),
        Some(b"a-2".to_vec())
    );

    // An operator deletes A's key; at once (before A's watch on its key can tell it), A's
    // proclaim reaches etcd and is refused there: the key with its create revision is gone.
    let name = contender_key(&second)
        .or_fail("the second contender key")?
        .to_string();
    raw.kv_client()
        .delete(name.as_str(), None)
        .await
        .or_fail("delete A's key")?;
    let stale = a.proclaim(&second, b"after the delete").await;
    assert!(refused(&stale), "{stale:?}");
    assert!(
        keys_under(&raw, &a.prefix(&key)).await?.is_empty(),
        "the refused proclaim recreated the key"
    );

    // B holds the lock now; A's stale grant cannot touch B's value.
    let third = b
        .try_acquire(&key, ttl)
        .await
        .or_fail("B's grant")?
        .or_fail("B takes it")?;
    b.proclaim(&third, b"b").await.or_fail("B proclaims")?;
    for grant in [&first, &second] {
        let stale = a.proclaim(grant, b"stale").await;
        assert!(refused(&stale), "{stale:?}");
    }
    let seen = a.inspect(&key).await.or_fail("A inspects")?;
    assert_eq!(value(&seen), Some(b"b".to_vec()));
    assert_eq!(seen.fence, Some(third.fence()));
    assert_eq!(
        b.release(&third).await.or_fail("B releases")?,
        Released::Released
    );
    Ok(())
}

/// A proclaimed value is bytes (every byte value, newlines and invalid UTF-8 included), stored
/// after the owner token in the holder's key: it reads back exactly through another client's
/// inspect, the owner id and the fence (the key's create revision) stay as they were, an empty
/// value is a value, and one longer than `MAX_VALUE_LEN` is refused before any request, leaving
/// the value as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proclaimed_values_round_trip_as_bytes() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let a = connect(&url(&server)).await?;
    let b = connect(&url(&server)).await?;
    let ttl = Duration::from_secs(10);
    let key = key("proclaim/bytes")?;
    let grant = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("A's grant")?
        .or_fail("a free key")?;
    let name = contender_key(&grant)
        .or_fail("the contender key")?
        .to_string();
    let stored = |raw: Client| {
        let name = name.clone();
        async move {
            let found = raw
                .kv_client()
                .get(name, None)
                .await
                .or_fail("read the holder's key")?;
            let kv = found.kvs().first().or_fail("the holder's key")?.clone();
            Ok::<_, common::Failure>((kv.value().to_vec(), kv.create_revision()))
        }
    };
    let (before, created) = stored(raw.clone()).await?;
    assert_eq!(before, grant.owner().to_hex().into_bytes());

    let binary: Vec<u8> = (0..=255u8).rev().chain([b'\n', 0, 0xff, b'\n']).collect();
    for value in [binary.clone(), Vec::new(), vec![b'x'; MAX_VALUE_LEN]] {
        a.proclaim(&grant, &value)
            .await
            .or_fail(format!("proclaim {} bytes", value.len()))?;
        let seen = b.inspect(&key).await.or_fail("B inspects")?;
        assert!(seen.held);
        assert_eq!(seen.value.as_ref(), Some(&value), "{} bytes", value.len());
        assert_eq!(seen.owner, Some(OwnerId::of(&grant.owner())));
        assert_eq!(seen.fence, Some(grant.fence()), "the fence moved");
        let (raw_value, create_revision) = stored(raw.clone()).await?;
        assert_eq!(create_revision, created);
        let mut expected = grant.owner().to_hex().into_bytes();
        expected.push(b'\n');
        expected.extend_from_slice(&value);
        assert_eq!(raw_value, expected, "the token, a newline, the value");
    }
    let too_long = a.proclaim(&grant, &vec![b'y'; MAX_VALUE_LEN + 1]).await;
    assert!(
        matches!(too_long, Err(Error::InvalidConfig { .. })),
        "{too_long:?}"
    );
    let seen = b.inspect(&key).await.or_fail("B inspects")?;
    assert_eq!(seen.value, Some(vec![b'x'; MAX_VALUE_LEN]));
    // Still ours to renew and to release by its create revision.
    a.renew(&grant, ttl).await.or_fail("renew")?;
    assert_eq!(
        a.release(&grant).await.or_fail("release")?,
        Released::Released
    );
    assert!(keys_under(&raw, &a.prefix(&key)).await?.is_empty());
    Ok(())
}
