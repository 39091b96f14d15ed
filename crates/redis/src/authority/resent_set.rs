//! The set script run twice with the same owner tokens, against a real Redis: what the Redis
//! Cluster client does when it sends a request again after a connection it had to repair.

use super::*;
use leasehold_servers::RedisServer;

type Outcome = std::result::Result<(), String>;

async fn run_set(a: &RedisAuthority, keys: &[String], args: &[String]) -> Result<Vec<i64>> {
    let Conn { mut con, .. } = a.connection("test", deadline_in(a.timeout())).await?;
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let Ints(fences) = a
        .inner
        .scripts
        .acquire_all
        .run(&mut con, &keys, args)
        .await
        .map_err(|e| errors::map(e, "test"))?;
    Ok(fences)
}

/// The lock and counter keys of `names`, as the script takes them, and its arguments for one
/// attempt (TTL, then one fresh token per key).
fn attempt(
    a: &RedisAuthority,
    names: &[&str],
) -> std::result::Result<(Vec<String>, Vec<String>), String> {
    let mut keys = Vec::new();
    let mut args = vec!["20000".to_string()];
    for name in names {
        let key = LockKey::new(*name).map_err(|e| e.to_string())?;
        let lock_key = a.inner.config.layout.lock_key(&key);
        keys.push(KeyLayout::fence_key_of(&lock_key));
        keys.insert(keys.len() - 1, lock_key);
        args.push(hex(&OwnerToken::generate().map_err(|e| e.to_string())?));
    }
    Ok((keys, args))
}

/// Run once more after it took the set, the script answers the same fences and raises no
/// counter; run once more after one of its keys went (expired in between), it answers "held"
/// and deletes the keys of that run that are left, which nobody was told of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_set_answers_its_first_run_or_gives_the_rest_back() -> Outcome {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .map_err(|e| format!("the harness task: {e}"))?
        .map_err(|e| format!("redis must start for this test: {e}"))?;
    let a = RedisAuthority::connect(&server.url())
        .await
        .map_err(|e| format!("connect: {e}"))?;

    let (keys, args) = attempt(&a, &["resent:1", "resent:2"])?;
    let first = run_set(&a, &keys, &args).await.map_err(|e| e.to_string())?;
    let again = run_set(&a, &keys, &args).await.map_err(|e| e.to_string())?;
    if first != vec![1, 1] || again != first {
        return Err(format!("first run {first:?}, resent {again:?}"));
    }
    let (other_keys, other_args) = attempt(&a, &["resent:1", "resent:2"])?;
    let held = run_set(&a, &other_keys, &other_args)
        .await
        .map_err(|e| e.to_string())?;
    if !held.is_empty() {
        return Err(format!("another attempt took the held set: {held:?}"));
    }

    let (keys, args) = attempt(&a, &["gone:1", "gone:2", "gone:3"])?;
    let first = run_set(&a, &keys, &args).await.map_err(|e| e.to_string())?;
    if first.len() != 3 {
        return Err(format!("the first run answered {first:?}"));
    }
    server
        .command(&["DEL", &keys[2]])
        .map_err(|e| format!("expire the second key: {e}"))?;
    let again = run_set(&a, &keys, &args).await.map_err(|e| e.to_string())?;
    if !again.is_empty() {
        return Err(format!("a resent set with a key gone answered {again:?}"));
    }
    for lock_key in keys.iter().step_by(2) {
        let left = server
            .command(&["EXISTS", lock_key])
            .map_err(|e| format!("EXISTS {lock_key}: {e}"))?;
        if left.trim() != "0" {
            return Err(format!("{lock_key} was left behind by the resent set"));
        }
    }
    Ok(())
}
