//! The servers' tick (`tickTime`), read with the `conf` four-letter word.
//!
//! The tick decides how late a server notices a session's expiry (the expiry slack), and on an
//! ensemble how late the leader learns that a session talking to a follower or an observer is
//! alive: each learner reports the sessions it heard from in its reply to the leader's ping,
//! every half tick. `minSessionTimeout` is configured apart from `tickTime` (it only defaults to
//! two ticks), so it cannot stand in for the tick. `conf` answers only where the servers list it
//! in `4lw.commands.whitelist`, and only on a plain client port (a TLS port is not asked).

use std::time::Duration;

use futures_util::future::join_all;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// More than any `conf` answer: the answer is read no further.
const MOST_READ: u64 = 64 * 1024;

/// The greatest `tickTime` among the servers of `hosts` (`host:port,...`, as the connect
/// string) that answer `conf` within `timeout`, asked all at once; `None` when none does (not
/// whitelisted, unreachable, or `secure`: a TLS client port). The greatest, because a longer
/// tick only makes the allowances derived from it more cautious.
pub(crate) async fn read(hosts: &str, secure: bool, timeout: Duration) -> Option<Duration> {
    if secure {
        return None;
    }
    let asked = hosts
        .split(',')
        .map(|host| tokio::time::timeout(timeout, ask(host)));
    join_all(asked)
        .await
        .into_iter()
        .filter_map(|answer| answer.ok().flatten())
        .max()
}

/// `conf` to one server, its `tickTime` if it answered with one.
async fn ask(host: &str) -> Option<Duration> {
    let mut stream = TcpStream::connect(host).await.ok()?;
    stream.write_all(b"conf").await.ok()?;
    let mut answer = String::new();
    stream
        .take(MOST_READ)
        .read_to_string(&mut answer)
        .await
        .ok()?;
    let tick = parse(&answer);
    if tick.is_none() {
        tracing::debug!(
            %host,
            answer = %answer.lines().next().unwrap_or_default(),
            "no tickTime in the ZooKeeper server's `conf` answer"
        );
    }
    tick
}

/// `tickTime=<ms>` in a `conf` answer.
fn parse(answer: &str) -> Option<Duration> {
    answer
        .lines()
        .find_map(|line| line.trim().strip_prefix("tickTime="))
        .and_then(|ms| ms.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tick_time_from_a_conf_answer() {
        let answer = "clientPort=2181\nsecureClientPort=-1\ntickTime=400\nminSessionTimeout=200\n";
        assert_eq!(parse(answer), Some(Duration::from_millis(400)));
        assert_eq!(
            parse("conf is not executed because it is not in the whitelist.\n"),
            None
        );
        assert_eq!(parse("tickTime=0\n"), None);
        assert_eq!(parse("tickTime=x\n"), None);
    }
}
