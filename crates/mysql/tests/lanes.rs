//! The lanes of the MySQL authority (its connections for lease statements) when one of them
//! goes silent: one TCP connection cut with an nftables DROP rule on its port pair (what a
//! primary moved behind a virtual IP without a reset looks like from here), the server and every
//! other connection fine.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use leasehold_core::{Authority, Instant, Released};
use leasehold_mysql::MysqlAuthority;

mod common;

use common::{connect, key, start_server, url, Failure, OrFail, Result};

/// The connections of the harness's user the server has now: id and client port.
async fn connections(admin: &MysqlAuthority) -> Result<BTreeSet<(i64, u16)>> {
    let rows: Vec<(i64, String)> = sqlx::query_as(
        "SELECT ID, HOST FROM information_schema.PROCESSLIST \
         WHERE USER = 'leasehold' AND ID <> CONNECTION_ID()",
    )
    .fetch_all(admin.pool())
    .await
    .or_fail("list the connections")?;
    Ok(rows
        .into_iter()
        .filter_map(|(id, host)| {
            let port = host.rsplit_once(':')?.1.parse().ok()?;
            Some((id, port))
        })
        .collect())
}

/// Runs an nftables script.
fn nft(script: &str) -> Result {
    let out = Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            if let Some(mut stdin) = child.stdin.take() {
                stdin.write_all(script.as_bytes())?;
            }
            child.wait_with_output()
        })
        .or_fail("run nft")?;
    if !out.status.success() {
        return Err(Failure::from(format!(
            "nft failed on {script:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

/// One TCP connection (the client port `client` to the server's `server` port) silenced by an
/// nftables table of its own, deleted on drop, also when the test fails.
struct Silenced(String);

impl Silenced {
    fn cut(client: u16, server: u16) -> Result<Self> {
        let table = format!("leasehold_mysql_lanes_{}_{client}", std::process::id());
        nft(&format!(
            "table inet {table} {{\n\
               chain out {{\n\
                 type filter hook output priority 0;\n\
                 tcp sport {client} tcp dport {server} drop\n\
                 tcp sport {server} tcp dport {client} drop\n\
               }}\n\
             }}\n"
        ))?;
        Ok(Silenced(table))
    }
}

impl Drop for Silenced {
    fn drop(&mut self) {
        let _ = nft(&format!("delete table inet {}\n", self.0));
    }
}

/// With one lane (`pool_size=1`) whose connection goes silent: the next acquisition's statement
/// is on it, and nothing tells a silent connection from a slow server. After half its time it
/// is sent again, with the same owner token, on a fresh connection (the silent statement lets
/// the only lane go), and the acquisition holds its key within the request timeout. Later
/// statements find the lane connected afresh; once the link is back, the silent statement lands
/// on a key its own retry holds and changes nothing: the grant releases as a grant should.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_lane_is_given_up_and_the_acquisition_sent_again() -> Result {
    let server = start_server().await?;
    // One pooled connection, so the listing below always runs on the same one (and leaves it
    // out): every other new connection is the lane's.
    let admin = connect(&format!("{}&pool_size=1", url(&server))).await?;
    admin.migrate().await.or_fail("migrate")?;
    let timeout = Duration::from_millis(1000);
    let a = connect(&format!("{}&pool_size=1", url(&server))).await?;
    let ttl = Duration::from_secs(10);
    let before = connections(&admin).await?;
    let warm = a
        .try_acquire(&key("lanes-warm")?, ttl)
        .await
        .or_fail("the lane's first statement")?
        .or_fail("a fresh key was held")?;
    let lane: Vec<_> = connections(&admin)
        .await?
        .difference(&before)
        .copied()
        .collect();
    let [(_, client_port)] = lane[..] else {
        return Err(format!("one new connection expected for the lane, found {lane:?}").into());
    };
    let silenced = Silenced::cut(client_port, server.port())?;
    let k = key("lanes-silent")?;
    let started = Instant::now();
    let grant = a
        .try_acquire(&k, ttl)
        .await
        .or_fail("an acquisition on a silent lane")?
        .or_fail("a fresh key was held")?;
    let took = started.elapsed();
    assert!(took < timeout, "the acquisition took {took:?}");
    assert!(
        took >= timeout / 2 - Duration::from_millis(50),
        "answered in {took:?}: the statement did not go to the silent connection first"
    );
    let next = Instant::now();
    let other = a
        .try_acquire(&key("lanes-after")?, ttl)
        .await
        .or_fail("the next statement")?
        .or_fail("a fresh key was held")?;
    assert!(next.elapsed() < timeout / 2, "{:?}", next.elapsed());
    drop(silenced);
    // The silent statement lands (TCP retransmits it) on the key its retry holds.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let seen = admin.inspect(&k).await.or_fail("inspect")?;
    assert_eq!(seen.fence, Some(grant.fence()), "{seen:?}");
    for g in [&grant, &other, &warm] {
        assert_eq!(a.release(g).await.or_fail("release")?, Released::Released);
    }
    Ok(())
}
