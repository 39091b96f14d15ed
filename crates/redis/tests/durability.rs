//! What survives on a real Redis, and what is declared: the counter reset of a restart without
//! persistence, the eviction policy and persistence read at connect (and a live lock key evicted
//! under a `volatile-*` policy, as declared), and fences that survive a crash on a server that
//! fsyncs every write.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::kit::{HarnessServer, OrFail, ServerFaults, TestResult};
use leasehold_conformance::scenarios;
use leasehold_conformance::{harness_call, Context, Failure, Verdict};
use leasehold_core::{Authority, ExclusionSafety, FenceSafety, LockKey, Released};
use leasehold_redis::RedisAuthority;
use leasehold_servers::{free_port, RedisServer};

mod common;

use common::{blocking, clients, command, info_field, start, url, Warnings};

/// Without persistence, a crash resets the fence counter: declared, and shown. Raising the
/// deployment epoch afterwards puts every new fence above every old one again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_resets_the_counter_as_declared() -> TestResult {
    let server = start().await?;
    let a = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect A")?;
    assert!(!a.capabilities().durable_fences);
    assert_eq!(a.capabilities().fence_safety, FenceSafety::FailoverUnsafe);
    let key = LockKey::new("restart").or_fail("the key")?;
    let ttl = Duration::from_secs(5);
    let mut before = Vec::new();
    for _ in 0..3 {
        let g = a
            .try_acquire(&key, ttl)
            .await
            .or_fail("A acquires")?
            .or_fail("the key is free")?;
        assert_eq!(g.fence().safety(), FenceSafety::FailoverUnsafe);
        before.push(g.fence());
        assert_eq!(
            a.release(&g).await.or_fail("A releases")?,
            Released::Released
        );
    }
    assert!(before.windows(2).all(|w| w[1] > w[0]), "{before:?}");
    {
        let s = server.clone();
        harness_call(move || s.restart())
            .await
            .or_fail("restart the server")?;
    }
    let b = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect B")?;
    let after = b
        .try_acquire(&key, ttl)
        .await
        .or_fail("B acquires")?
        .or_fail("the key is free")?;
    assert_eq!(
        after.fence().raw(),
        1,
        "the counter starts again after a restart"
    );
    assert!(
        after.fence() < before[2],
        "{:?} after, {:?} before",
        after.fence(),
        before
    );
    assert_eq!(
        b.release(&after).await.or_fail("B releases")?,
        Released::Released
    );

    let bumped = RedisAuthority::connect(&format!("{}&epoch=1", url(&server)))
        .await
        .or_fail("connect with epoch 1")?;
    let g = bumped
        .try_acquire(&key, ttl)
        .await
        .or_fail("acquire with epoch 1")?
        .or_fail("the key is free")?;
    assert!(
        g.fence() > before[2],
        "epoch 1: {:?} vs {:?}",
        g.fence(),
        before[2]
    );
    assert_eq!(g.fence().epoch().get(), 1);
    Ok(())
}

/// Sets the server's eviction policy and connects a fresh authority, collecting its warnings.
async fn connect_under_policy(
    server: &Arc<RedisServer>,
    url: &str,
    policy: &str,
) -> TestResult<(RedisAuthority, Vec<String>)> {
    assert_eq!(
        command(server, &["CONFIG", "SET", "maxmemory-policy", policy]).await?,
        "OK"
    );
    let warnings = Warnings::default();
    let a = {
        let _guard = tracing::subscriber::set_default(warnings.clone());
        RedisAuthority::connect(url)
            .await
            .or_fail(format!("connect under {policy}"))?
    };
    Ok((a, warnings.taken()))
}

/// An evicting `maxmemory-policy` can drop a lock key (every policy but `noeviction`) or a fence
/// counter (`allkeys-*`). The authority reads the policy at connect and warns; and since the
/// server persists every write (`appendonly yes`, `appendfsync always`), it declares its fences
/// durable exactly when no counter can be evicted, and leases exclusive only under
/// `noeviction`. A user that may not read the configuration still connects, and nothing is
/// claimed for it: fences not durable, leases declared able to end early.
///
/// A current-thread runtime, so that the warnings are logged on the thread that collects them.
#[tokio::test]
async fn an_evicting_maxmemory_policy_is_warned_about_and_fences_are_not_declared_durable(
) -> TestResult {
    let server = start().await?;
    for (name, value) in [("appendonly", "yes"), ("appendfsync", "always")] {
        assert_eq!(
            command(&server, &["CONFIG", "SET", name, value]).await?,
            "OK"
        );
    }
    let url = url(&server);

    let (a, warnings) = connect_under_policy(&server, &url, "allkeys-lru").await?;
    assert!(!a.capabilities().durable_fences);
    let settings = a
        .server_settings()
        .or_fail("the default user may read the configuration")?;
    assert_eq!(settings.maxmemory_policy(), "allkeys-lru");
    assert!(settings.appendonly() && settings.appendfsync() == "always");
    assert!(settings.may_evict_fence_counters());
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("allkeys-lru") && w.contains("fence")),
        "no warning about evicted fence counters: {warnings:?}"
    );

    let (a, warnings) = connect_under_policy(&server, &url, "volatile-lru").await?;
    assert!(
        a.capabilities().durable_fences,
        "volatile-* never evicts a counter (it has no expiry)"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("volatile-lru") && w.contains("lock key")),
        "no warning about evicted lock keys: {warnings:?}"
    );

    let (a, warnings) = connect_under_policy(&server, &url, "noeviction").await?;
    assert!(a.capabilities().durable_fences);
    assert_eq!(a.capabilities().exclusion, ExclusionSafety::Exclusive);
    assert!(warnings.is_empty(), "{warnings:?}");

    // Without persistence, fences are not durable whatever the policy.
    assert_eq!(
        command(&server, &["CONFIG", "SET", "appendonly", "no"]).await?,
        "OK"
    );
    let (a, warnings) = connect_under_policy(&server, &url, "noeviction").await?;
    assert!(!a.capabilities().durable_fences);
    assert!(warnings.is_empty(), "{warnings:?}");

    // A user that may not run CONFIG: it connects and locks; nothing is claimed.
    command(
        &server,
        &[
            "ACL", "SETUSER", "app", "on", ">app-pw", "~*", "&*", "+@all", "-config",
        ],
    )
    .await?;
    let app_url = format!(
        "redis://app:app-pw@127.0.0.1:{}?timeout_ms=1000",
        server.port()
    );
    let (app, warnings) = connect_under_policy(&server, &app_url, "allkeys-lru").await?;
    assert!(!app.capabilities().durable_fences);
    assert!(
        app.capabilities().exclusion.can_end_early(),
        "an eviction policy that cannot be read cannot be ruled out"
    );
    assert_eq!(app.server_settings(), None);
    assert!(warnings.is_empty(), "{warnings:?}");
    let key = LockKey::new("policy").or_fail("the key")?;
    let g = app
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .or_fail("the app user acquires")?
        .or_fail("the key is free")?;
    assert_eq!(
        app.release(&g).await.or_fail("the app user releases")?,
        Released::Released
    );
    Ok(())
}

/// Under a `volatile-*` policy the lock keys, which carry an expiry, are exactly what the server
/// evicts. With `volatile-ttl` and a lock TTL shorter than every other key's, the first eviction
/// takes the lock key: a second client then gets the key while the first grant is valid by its
/// holder's own deadline, with a greater fence. The authority must declare that leases can end
/// early there (and only a `noeviction` server is declared exclusive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volatile_policy_evicts_a_live_lock_key_as_declared() -> TestResult {
    let server = start().await?;
    let url = url(&server);
    let set = |name: &'static str, value: String| {
        let server = server.clone();
        async move {
            command(&server, &["CONFIG", "SET", name, &value])
                .await
                .map(drop)
        }
    };
    set("maxmemory-policy", "volatile-ttl".into()).await?;
    let a = RedisAuthority::connect(&url).await.or_fail("connect A")?;
    let b = RedisAuthority::connect(&url).await.or_fail("connect B")?;
    let declared = &a.capabilities().exclusion;
    if !declared.can_end_early() || !declared.to_string().contains("volatile-ttl") {
        return Err(Failure::new(format!(
            "under volatile-ttl the authority declares its leases {declared}"
        )));
    }

    let key = LockKey::new("evicted").or_fail("the key")?;
    let ttl = Duration::from_secs(60);
    let first = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("first acquisition")?
        .or_fail("the fresh key is held")?;
    // Memory pressure: a limit just above what is used, then keys that live longer than the
    // lock, until the server evicts.
    let used = command(&server, &["INFO", "memory"]).await?;
    let used: u64 = info_field(&used, "used_memory")
        .and_then(|v| v.parse().ok())
        .or_fail("INFO memory without used_memory")?;
    set("maxmemory", (used + 512 * 1024).to_string()).await?;
    let lock_key = a.config().layout().lock_key(&key);
    let server2 = server.clone();
    let filled = blocking(move || {
        let value = "x".repeat(16 * 1024);
        for n in 0..2000 {
            let filler = format!("filler:{n}");
            server2
                .command(&["SET", &filler, &value, "PX", "3600000"])
                .map_err(|e| format!("SET {filler}: {e}"))?;
            let exists = server2
                .command(&["EXISTS", &lock_key])
                .map_err(|e| format!("EXISTS: {e}"))?;
            if exists == "0" {
                return Ok(n + 1);
            }
        }
        Err("2000 long-lived keys of 16 KiB did not evict the lock key".to_string())
    })
    .await
    .map_err(Failure::new)?;
    set("maxmemory", "0".into()).await?;
    if !first.is_valid() {
        return Err(Failure::new(
            "the first grant's own deadline passed during the test",
        ));
    }
    let second = b
        .try_acquire(&key, ttl)
        .await
        .or_fail("second acquisition")?
        .or_fail("the evicted key is still held")?;
    let overlap = first.remaining();
    println!(
        "lock key evicted after {filled} fillers; a second client holds it with fence {} while \
         the first grant (fence {}) has {overlap:?} left by its own deadline",
        second.fence(),
        first.fence()
    );
    if second.fence() <= first.fence() || overlap.is_zero() {
        return Err(Failure::new(format!(
            "expected a greater fence while the first grant is valid: {} after {}, {overlap:?} \
             left",
            second.fence(),
            first.fence()
        )));
    }
    Ok(())
}

/// A Redis that persists every write before acknowledging it (`appendonly yes`,
/// `appendfsync always`), which the harness does not offer: started here the way the harness
/// starts servers, and crashed (SIGKILL) and restarted on the same data by its `restart` fault.
struct PersistentRedis {
    port: u16,
    process: leasehold_servers::ManagedProcess,
}

impl PersistentRedis {
    fn start() -> Result<Self, String> {
        use leasehold_servers::process::{find_program, server_dir};
        use leasehold_servers::{CommandSpec, ManagedProcess, READY_TIMEOUT};
        let program = find_program("redis-server").ok_or("redis-server must be installed")?;
        let port = free_port().map_err(|e| e.to_string())?;
        let dir = server_dir("redis-aof").map_err(|e| e.to_string())?;
        let args = vec![
            "--port".to_string(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "yes".into(),
            "--appendfsync".into(),
            "always".into(),
            "--dir".into(),
            dir.path().display().to_string(),
        ];
        let process = ManagedProcess::spawn("redis-aof", dir, CommandSpec::new(program, args))
            .map_err(|e| e.to_string())?;
        let server = PersistentRedis { port, process };
        server
            .process
            .wait_ready(READY_TIMEOUT, || server.ping())
            .map_err(|e| format!("the persistent Redis must start for this test: {e}"))?;
        Ok(server)
    }

    fn ping(&self) -> Result<(), String> {
        let answer = leasehold_servers::redis::resp_command(
            self.port,
            None,
            &["PING"],
            Duration::from_secs(1),
        )?;
        if answer == "PONG" {
            Ok(())
        } else {
            Err(format!("PING answered {answer:?}"))
        }
    }
}

impl HarnessServer for PersistentRedis {
    fn restart(&self) -> leasehold_servers::Result<()> {
        self.process.kill()?;
        self.process.respawn()?;
        self.process
            .wait_ready(leasehold_servers::READY_TIMEOUT, || self.ping())
    }

    fn pause(&self) -> leasehold_servers::Result<()> {
        self.process.pause()
    }

    fn resume(&self) -> leasehold_servers::Result<()> {
        self.process.resume()
    }
}

/// Where the server persists every write before acknowledging it and evicts no counter, the
/// authority declares its fences durable, and they are: across a crash (SIGKILL) and restart,
/// fences keep growing (the shared scenario passes, where without persistence it reports the
/// declared reset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_declared_durable_on_an_fsyncing_server_survive_a_crash() -> TestResult {
    let server = Arc::new(
        blocking(PersistentRedis::start)
            .await
            .map_err(Failure::new)?,
    );
    let url = format!("redis://127.0.0.1:{}?timeout_ms=1000", server.port);
    let a = RedisAuthority::connect(&url).await.or_fail("connect")?;
    assert!(
        a.capabilities().durable_fences,
        "appendonly yes, appendfsync always, noeviction: {:?}",
        a.server_settings()
    );
    let ctx = Context::new(Arc::new(clients(&url)))
        .await
        .or_fail("connect the first client")?
        .with_faults(Arc::new(ServerFaults::new(server)));
    assert!(ctx.capabilities().durable_fences);
    let outcome = scenarios::fences_survive_restart(&ctx).await;
    assert_eq!(outcome, Ok(Verdict::Passed), "{outcome:?}");
    let outcome = scenarios::election_epochs_survive_restart(&ctx).await;
    assert_eq!(outcome, Ok(Verdict::Passed), "{outcome:?}");
    Ok(())
}
