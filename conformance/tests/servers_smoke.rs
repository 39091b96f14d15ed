//! Smoke tests of the native server harness: every server and cluster starts, serves one real
//! operation through its client crate, and survives the faults the scenarios will use.
//!
//! These need the Debian packages (`./scripts/test` installs them). A server that cannot start
//! fails its test; nothing is skipped.

use leasehold_conformance::kit::{OrFail, TestResult};
use std::time::{Duration, Instant};

use leasehold_servers::{
    EtcdCluster, EtcdServer, PostgresServer, RedisServer, ZkEnsemble, ZkServer,
};
use sqlx::Connection;

/// Retries `op` until it succeeds or `bound` has passed; returns the value and the time taken.
async fn eventually<T, E: std::fmt::Debug, F, Fut>(
    what: &str,
    bound: Duration,
    mut op: F,
) -> (T, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let start = Instant::now();
    loop {
        match tokio::time::timeout(Duration::from_secs(1), op()).await {
            Ok(Ok(value)) => return (value, start.elapsed()),
            Ok(Err(e)) if start.elapsed() > bound => {
                panic!("{what}: still failing after {bound:?}: {e:?}")
            }
            Err(_) if start.elapsed() > bound => panic!("{what}: still timing out after {bound:?}"),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

fn etcd_options() -> etcd_client::ConnectOptions {
    etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(1))
}

async fn etcd_get(client: &mut etcd_client::Client, key: &str) -> TestResult<Option<Vec<u8>>> {
    let response = client.get(key, None).await.or_fail("etcd get")?;
    Ok(response.kvs().first().map(|kv| kv.value().to_vec()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_single_node_put_get_and_restart_on_same_data() -> TestResult {
    let started = Instant::now();
    let etcd = EtcdServer::start().or_fail("etcd starts")?;
    eprintln!("etcd single node ready in {:?}", started.elapsed());

    let mut client = etcd_client::Client::connect([etcd.endpoint()], Some(etcd_options()))
        .await
        .or_fail("connect")?;
    client.put("smoke", "v1", None).await.or_fail("put")?;
    assert_eq!(
        etcd_get(&mut client, "smoke").await?.as_deref(),
        Some(&b"v1"[..])
    );

    let old_pid = etcd.pid().or_fail("running")?;
    etcd.kill().or_fail("kill")?;
    assert_eq!(etcd.pid(), None);
    let restarted = Instant::now();
    etcd.restart().or_fail("restart")?;
    eprintln!("etcd single node restarted in {:?}", restarted.elapsed());
    assert_ne!(etcd.pid(), Some(old_pid));

    let mut client = etcd_client::Client::connect([etcd.endpoint()], Some(etcd_options()))
        .await
        .or_fail("reconnect")?;
    assert_eq!(
        etcd_get(&mut client, "smoke").await?.as_deref(),
        Some(&b"v1"[..]),
        "the key survived the crash"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_cluster_survives_a_leader_crash_and_the_member_rejoins() -> TestResult {
    let started = Instant::now();
    let cluster = EtcdCluster::start(3).or_fail("etcd cluster starts")?;
    eprintln!("etcd 3-member cluster ready in {:?}", started.elapsed());
    assert_eq!(cluster.endpoints().len(), 3);

    let mut client = etcd_client::Client::connect(cluster.endpoints(), Some(etcd_options()))
        .await
        .or_fail("connect")?;
    client.put("before", "1", None).await.or_fail("put")?;
    assert_eq!(
        etcd_get(&mut client, "before").await?.as_deref(),
        Some(&b"1"[..])
    );

    let leader = cluster.leader().or_fail("a leader")?;
    let killed_at = Instant::now();
    cluster.member(leader).kill().or_fail("kill the leader")?;
    let new_leader = cluster.leader().or_fail("a new leader")?;
    eprintln!("etcd: new leader after {:?}", killed_at.elapsed());
    assert_ne!(new_leader, leader, "the dead member cannot lead");
    let survivors: Vec<String> = (0..3)
        .filter(|&i| i != leader)
        .map(|i| cluster.member(i).endpoint())
        .collect();
    let survivor_client = etcd_client::Client::connect(survivors, Some(etcd_options()))
        .await
        .or_fail("connect to the survivors")?;
    let (_, took) = eventually(
        "a write after the leader crash",
        Duration::from_secs(10),
        || {
            let mut c = survivor_client.clone();
            async move { c.put("after", "2", None).await }
        },
    )
    .await;
    eprintln!("etcd: then the first write took {took:?}");

    let restarted = Instant::now();
    cluster
        .member(leader)
        .restart()
        .or_fail("the old leader restarts")?;
    eprintln!("etcd: killed member rejoined in {:?}", restarted.elapsed());
    let mut rejoined =
        etcd_client::Client::connect([cluster.member(leader).endpoint()], Some(etcd_options()))
            .await
            .or_fail("connect to the rejoined member")?;
    assert_eq!(
        etcd_get(&mut rejoined, "after").await?.as_deref(),
        Some(&b"2"[..]),
        "the rejoined member has the write it missed"
    );
    let ctl = cluster
        .etcdctl()
        .or_fail("etcdctl")?
        .args(["endpoint", "health"])
        .output()
        .or_fail("run etcdctl")?;
    assert!(ctl.status.success(), "etcdctl endpoint health: {ctl:?}");
    Ok(())
}

async fn zk_connect(hosts: &str) -> TestResult<zookeeper_client::Client> {
    zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(4))
        .with_connection_timeout(Duration::from_secs(1))
        .connect(hosts)
        .await
        .or_fail("zookeeper connect")
}

fn persistent() -> zookeeper_client::CreateOptions<'static> {
    zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_standalone_create_get() -> TestResult {
    let started = Instant::now();
    let zk = ZkServer::start().or_fail("zookeeper starts")?;
    eprintln!("zookeeper standalone ready in {:?}", started.elapsed());
    assert_eq!(zk.mode().as_deref(), Some("standalone"));
    assert_eq!(zk.four_letter_word("ruok").or_fail("ruok")?, "imok");

    let client = zk_connect(&zk.connect_string()).await?;
    client
        .create("/smoke", b"hello", &persistent())
        .await
        .or_fail("create")?;
    let (data, stat) = client.get_data("/smoke").await.or_fail("get")?;
    assert_eq!(data, b"hello");
    assert!(stat.czxid > 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_ensemble_elects_a_new_leader_with_a_new_epoch() -> TestResult {
    let started = Instant::now();
    let ensemble = ZkEnsemble::start(3).or_fail("zookeeper ensemble starts")?;
    eprintln!("zookeeper 3-node ensemble ready in {:?}", started.elapsed());

    let client = zk_connect(&ensemble.connect_string()).await?;
    client
        .create("/before", b"", &persistent())
        .await
        .or_fail("create")?;
    let (_, before) = client.get_data("/before").await.or_fail("get")?;
    drop(client);

    let leader = ensemble.leader().or_fail("a leader")?;
    let killed_at = Instant::now();
    ensemble.member(leader).kill().or_fail("kill the leader")?;
    let new_leader = ensemble.leader().or_fail("a new leader")?;
    eprintln!("zookeeper: new leader after {:?}", killed_at.elapsed());
    assert_ne!(new_leader, leader);

    let survivors = (0..3)
        .filter(|&i| i != leader)
        .map(|i| ensemble.member(i).connect_string())
        .collect::<Vec<_>>()
        .join(",");
    let client = zk_connect(&survivors).await?;
    let (_, took) = eventually(
        "a create after the leader crash",
        Duration::from_secs(10),
        || {
            let client = client.clone();
            async move {
                match client.create("/after", b"", &persistent()).await {
                    Ok(_) | Err(zookeeper_client::Error::NodeExists) => Ok(()),
                    Err(e) => Err(e),
                }
            }
        },
    )
    .await;
    eprintln!("zookeeper: then the first create took {took:?}");
    let (_, after) = client.get_data("/after").await.or_fail("get")?;
    assert!(
        after.czxid >> 32 > before.czxid >> 32,
        "the epoch (czxid's high 32 bits) went up: {:#x} -> {:#x}",
        before.czxid,
        after.czxid
    );

    ensemble
        .member(leader)
        .restart()
        .or_fail("the old leader restarts")?;
    assert_eq!(ensemble.member(leader).mode().as_deref(), Some("follower"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_replica_follows_the_primary_and_can_be_promoted() -> TestResult {
    let started = Instant::now();
    let primary = RedisServer::start().or_fail("redis primary starts")?;
    let replica = RedisServer::start_replica_of(&primary).or_fail("redis replica starts")?;
    eprintln!(
        "redis primary + synced replica ready in {:?}",
        started.elapsed()
    );

    let client = redis::Client::open(primary.url()).or_fail("url")?;
    let mut primary_con = client
        .get_multiplexed_async_connection()
        .await
        .or_fail("connect")?;
    let _: () = redis::cmd("SET")
        .arg("smoke")
        .arg("v1")
        .query_async(&mut primary_con)
        .await
        .or_fail("SET")?;

    let replica_client = redis::Client::open(replica.url()).or_fail("url")?;
    let mut replica_con = replica_client
        .get_multiplexed_async_connection()
        .await
        .or_fail("connect to the replica")?;
    let (value, _) = eventually(
        "the write reaching the replica",
        Duration::from_secs(5),
        || {
            let mut con = replica_con.clone();
            async move {
                let value: Option<String> =
                    redis::cmd("GET").arg("smoke").query_async(&mut con).await?;
                value.ok_or_else(|| {
                    redis::RedisError::from((redis::ErrorKind::Io, "not replicated yet"))
                })
            }
        },
    )
    .await;
    assert_eq!(value, "v1");
    let refused: redis::RedisResult<()> = redis::cmd("SET")
        .arg("smoke")
        .arg("v2")
        .query_async(&mut replica_con)
        .await;
    assert!(refused.is_err(), "a replica refuses writes");

    assert_eq!(replica.role().or_fail("role")?, "slave");
    replica.promote().or_fail("promote")?;
    assert_eq!(replica.role().or_fail("role")?, "master");
    let _: () = redis::cmd("SET")
        .arg("smoke")
        .arg("v2")
        .query_async(&mut replica_con)
        .await
        .or_fail("the promoted replica takes writes")?;
    assert_eq!(replica.command(&["GET", "smoke"]).or_fail("GET")?, "v2");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_survives_kill_9_and_restarts_on_the_same_data() -> TestResult {
    let started = Instant::now();
    let pg = PostgresServer::start().or_fail("postgres starts")?;
    eprintln!("postgres (initdb + start) ready in {:?}", started.elapsed());

    let mut con = sqlx::PgConnection::connect(&pg.url())
        .await
        .or_fail("connect")?;
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut con)
        .await
        .or_fail("SELECT 1")?;
    assert_eq!(one, 1);
    sqlx::query("CREATE TABLE smoke (v text)")
        .execute(&mut con)
        .await
        .or_fail("create table")?;
    sqlx::query("INSERT INTO smoke VALUES ('kept')")
        .execute(&mut con)
        .await
        .or_fail("insert")?;

    let old_pid = pg.pid().or_fail("running")?;
    pg.kill().or_fail("kill -9")?;
    let restarted = Instant::now();
    pg.restart().or_fail("restart on the same data")?;
    eprintln!(
        "postgres restarted after SIGKILL in {:?}",
        restarted.elapsed()
    );
    assert_ne!(pg.pid(), Some(old_pid));
    assert!(
        con.ping().await.is_err(),
        "the old connection died with the server"
    );

    let mut con = sqlx::PgConnection::connect(&pg.url())
        .await
        .or_fail("reconnect")?;
    let kept: String = sqlx::query_scalar("SELECT v FROM smoke")
        .fetch_one(&mut con)
        .await
        .or_fail("select")?;
    assert_eq!(kept, "kept");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_times_out_and_serves_again_after_resume() -> TestResult {
    let server = RedisServer::start().or_fail("redis starts")?;
    let client = redis::Client::open(server.url()).or_fail("url")?;
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_millis(500)));
    let mut con = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .or_fail("connect")?;
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query_async(&mut con)
        .await
        .or_fail("SET")?;

    server.pause().or_fail("SIGSTOP")?;
    let during = tokio::time::timeout(
        Duration::from_secs(2),
        redis::cmd("GET")
            .arg("k")
            .query_async::<Option<String>>(&mut con),
    )
    .await;
    assert!(
        !matches!(during, Ok(Ok(_))),
        "a paused server must not answer: {during:?}"
    );

    server.resume().or_fail("SIGCONT")?;
    let mut fresh = client
        .get_multiplexed_async_connection()
        .await
        .or_fail("reconnect")?;
    let value: Option<String> = redis::cmd("GET")
        .arg("k")
        .query_async(&mut fresh)
        .await
        .or_fail("GET after resume")?;
    assert_eq!(value.as_deref(), Some("v"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_variants_refuse_a_wrong_password() -> TestResult {
    let redis = RedisServer::start_with_password("s3cret").or_fail("redis starts")?;
    let wrong = redis::Client::open(redis.url_with_password("wrong")).or_fail("url")?;
    assert!(wrong.get_multiplexed_async_connection().await.is_err());
    let right = redis::Client::open(redis.url()).or_fail("url")?;
    let mut con = right
        .get_multiplexed_async_connection()
        .await
        .or_fail("right password")?;
    let pong: String = redis::cmd("PING")
        .query_async(&mut con)
        .await
        .or_fail("PING")?;
    assert_eq!(pong, "PONG");

    let pg = PostgresServer::start_with_password("s3cret").or_fail("postgres starts")?;
    assert!(sqlx::PgConnection::connect(&pg.url_with_password("wrong"))
        .await
        .is_err());
    let mut con = sqlx::PgConnection::connect(&pg.url())
        .await
        .or_fail("right password")?;
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut con)
        .await
        .or_fail("SELECT 1")?;
    assert_eq!(one, 1);
    Ok(())
}
