//! Smoke tests of the native server harness: every server and cluster starts, serves one real
//! operation through its client crate, and survives the faults the scenarios will use.
//!
//! These need the Debian packages (`./scripts/test` installs them). A server that cannot start
//! fails its test; nothing is skipped.

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

async fn etcd_get(client: &mut etcd_client::Client, key: &str) -> Option<Vec<u8>> {
    let response = client.get(key, None).await.expect("etcd get");
    response.kvs().first().map(|kv| kv.value().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_single_node_put_get_and_restart_on_same_data() {
    let started = Instant::now();
    let etcd = EtcdServer::start().expect("etcd starts");
    eprintln!("etcd single node ready in {:?}", started.elapsed());

    let mut client = etcd_client::Client::connect([etcd.endpoint()], Some(etcd_options()))
        .await
        .expect("connect");
    client.put("smoke", "v1", None).await.expect("put");
    assert_eq!(
        etcd_get(&mut client, "smoke").await.as_deref(),
        Some(&b"v1"[..])
    );

    let old_pid = etcd.pid().expect("running");
    etcd.kill().expect("kill");
    assert_eq!(etcd.pid(), None);
    let restarted = Instant::now();
    etcd.restart().expect("restart");
    eprintln!("etcd single node restarted in {:?}", restarted.elapsed());
    assert_ne!(etcd.pid(), Some(old_pid));

    let mut client = etcd_client::Client::connect([etcd.endpoint()], Some(etcd_options()))
        .await
        .expect("reconnect");
    assert_eq!(
        etcd_get(&mut client, "smoke").await.as_deref(),
        Some(&b"v1"[..]),
        "the key survived the crash"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_cluster_survives_a_leader_crash_and_the_member_rejoins() {
    let started = Instant::now();
    let cluster = EtcdCluster::start(3).expect("etcd cluster starts");
    eprintln!("etcd 3-member cluster ready in {:?}", started.elapsed());
    assert_eq!(cluster.endpoints().len(), 3);

    let mut client = etcd_client::Client::connect(cluster.endpoints(), Some(etcd_options()))
        .await
        .expect("connect");
    client.put("before", "1", None).await.expect("put");
    assert_eq!(
        etcd_get(&mut client, "before").await.as_deref(),
        Some(&b"1"[..])
    );

    let leader = cluster.leader().expect("a leader");
    let killed_at = Instant::now();
    cluster.member(leader).kill().expect("kill the leader");
    let new_leader = cluster.leader().expect("a new leader");
    eprintln!("etcd: new leader after {:?}", killed_at.elapsed());
    assert_ne!(new_leader, leader, "the dead member cannot lead");
    let survivors: Vec<String> = (0..3)
        .filter(|&i| i != leader)
        .map(|i| cluster.member(i).endpoint())
        .collect();
    let survivor_client = etcd_client::Client::connect(survivors, Some(etcd_options()))
        .await
        .expect("connect to the survivors");
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
        .expect("the old leader restarts");
    eprintln!("etcd: killed member rejoined in {:?}", restarted.elapsed());
    let mut rejoined =
        etcd_client::Client::connect([cluster.member(leader).endpoint()], Some(etcd_options()))
            .await
            .expect("connect to the rejoined member");
    assert_eq!(
        etcd_get(&mut rejoined, "after").await.as_deref(),
        Some(&b"2"[..]),
        "the rejoined member has the write it missed"
    );
    let ctl = cluster
        .etcdctl()
        .expect("etcdctl")
        .args(["endpoint", "health"])
        .output()
        .expect("run etcdctl");
    assert!(ctl.status.success(), "etcdctl endpoint health: {ctl:?}");
}

async fn zk_connect(hosts: &str) -> zookeeper_client::Client {
    zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(4))
        .with_connection_timeout(Duration::from_secs(1))
        .connect(hosts)
        .await
        .expect("zookeeper connect")
}

fn persistent() -> zookeeper_client::CreateOptions<'static> {
    zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_standalone_create_get() {
    let started = Instant::now();
    let zk = ZkServer::start().expect("zookeeper starts");
    eprintln!("zookeeper standalone ready in {:?}", started.elapsed());
    assert_eq!(zk.mode().as_deref(), Some("standalone"));
    assert_eq!(zk.four_letter_word("ruok").expect("ruok"), "imok");

    let client = zk_connect(&zk.connect_string()).await;
    client
        .create("/smoke", b"hello", &persistent())
        .await
        .expect("create");
    let (data, stat) = client.get_data("/smoke").await.expect("get");
    assert_eq!(data, b"hello");
    assert!(stat.czxid > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_ensemble_elects_a_new_leader_with_a_new_epoch() {
    let started = Instant::now();
    let ensemble = ZkEnsemble::start(3).expect("zookeeper ensemble starts");
    eprintln!("zookeeper 3-node ensemble ready in {:?}", started.elapsed());

    let client = zk_connect(&ensemble.connect_string()).await;
    client
        .create("/before", b"", &persistent())
        .await
        .expect("create");
    let (_, before) = client.get_data("/before").await.expect("get");
    drop(client);

    let leader = ensemble.leader().expect("a leader");
    let killed_at = Instant::now();
    ensemble.member(leader).kill().expect("kill the leader");
    let new_leader = ensemble.leader().expect("a new leader");
    eprintln!("zookeeper: new leader after {:?}", killed_at.elapsed());
    assert_ne!(new_leader, leader);

    let survivors = (0..3)
        .filter(|&i| i != leader)
        .map(|i| ensemble.member(i).connect_string())
        .collect::<Vec<_>>()
        .join(",");
    let client = zk_connect(&survivors).await;
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
    let (_, after) = client.get_data("/after").await.expect("get");
    assert!(
        after.czxid >> 32 > before.czxid >> 32,
        "the epoch (czxid's high 32 bits) went up: {:#x} -> {:#x}",
        before.czxid,
        after.czxid
    );

    ensemble
        .member(leader)
        .restart()
        .expect("the old leader restarts");
    assert_eq!(ensemble.member(leader).mode().as_deref(), Some("follower"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_replica_follows_the_primary_and_can_be_promoted() {
    let started = Instant::now();
    let primary = RedisServer::start().expect("redis primary starts");
    let replica = RedisServer::start_replica_of(&primary).expect("redis replica starts");
    eprintln!(
        "redis primary + synced replica ready in {:?}",
        started.elapsed()
    );

    let client = redis::Client::open(primary.url()).expect("url");
    let mut primary_con = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let _: () = redis::cmd("SET")
        .arg("smoke")
        .arg("v1")
        .query_async(&mut primary_con)
        .await
        .expect("SET");

    let replica_client = redis::Client::open(replica.url()).expect("url");
    let mut replica_con = replica_client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the replica");
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

    assert_eq!(replica.role().expect("role"), "slave");
    replica.promote().expect("promote");
    assert_eq!(replica.role().expect("role"), "master");
    let _: () = redis::cmd("SET")
        .arg("smoke")
        .arg("v2")
        .query_async(&mut replica_con)
        .await
        .expect("the promoted replica takes writes");
    assert_eq!(replica.command(&["GET", "smoke"]).expect("GET"), "v2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_survives_kill_9_and_restarts_on_the_same_data() {
    let started = Instant::now();
    let pg = PostgresServer::start().expect("postgres starts");
    eprintln!("postgres (initdb + start) ready in {:?}", started.elapsed());

    let mut con = sqlx::PgConnection::connect(&pg.url())
        .await
        .expect("connect");
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut con)
        .await
        .expect("SELECT 1");
    assert_eq!(one, 1);
    sqlx::query("CREATE TABLE smoke (v text)")
        .execute(&mut con)
        .await
        .expect("create table");
    sqlx::query("INSERT INTO smoke VALUES ('kept')")
        .execute(&mut con)
        .await
        .expect("insert");

    let old_pid = pg.pid().expect("running");
    pg.kill().expect("kill -9");
    let restarted = Instant::now();
    pg.restart().expect("restart on the same data");
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
        .expect("reconnect");
    let kept: String = sqlx::query_scalar("SELECT v FROM smoke")
        .fetch_one(&mut con)
        .await
        .expect("select");
    assert_eq!(kept, "kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_times_out_and_serves_again_after_resume() {
    let server = RedisServer::start().expect("redis starts");
    let client = redis::Client::open(server.url()).expect("url");
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_millis(500)));
    let mut con = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect");
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query_async(&mut con)
        .await
        .expect("SET");

    server.pause().expect("SIGSTOP");
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

    server.resume().expect("SIGCONT");
    let mut fresh = client
        .get_multiplexed_async_connection()
        .await
        .expect("reconnect");
    let value: Option<String> = redis::cmd("GET")
        .arg("k")
        .query_async(&mut fresh)
        .await
        .expect("GET after resume");
    assert_eq!(value.as_deref(), Some("v"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_variants_refuse_a_wrong_password() {
    let redis = RedisServer::start_with_password("s3cret").expect("redis starts");
    let wrong = redis::Client::open(redis.url_with_password("wrong")).expect("url");
    assert!(wrong.get_multiplexed_async_connection().await.is_err());
    let right = redis::Client::open(redis.url()).expect("url");
    let mut con = right
        .get_multiplexed_async_connection()
        .await
        .expect("right password");
    let pong: String = redis::cmd("PING")
        .query_async(&mut con)
        .await
        .expect("PING");
    assert_eq!(pong, "PONG");

    let pg = PostgresServer::start_with_password("s3cret").expect("postgres starts");
    assert!(sqlx::PgConnection::connect(&pg.url_with_password("wrong"))
        .await
        .is_err());
    let mut con = sqlx::PgConnection::connect(&pg.url())
        .await
        .expect("right password");
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut con)
        .await
        .expect("SELECT 1");
    assert_eq!(one, 1);
}
