//! The three Lua scripts, and running them by SHA with the full text as the fallback.

use redis::aio::MultiplexedConnection;
use redis::{ErrorKind, FromRedisValue, RedisResult, ServerErrorKind};

/// Acquire, one atomic step. `KEYS[1]` the lock key, `KEYS[2]` the fence counter; `ARGV[1]` the
/// owner token, `ARGV[2]` the TTL in milliseconds.
///
/// Returns one integer (an integer reply is measurably cheaper than an array):
/// * `> 0`: the key was free and is now ours; the value is the fence (the counter after `INCR`);
/// * `< 0`: the key is held and expires in `-reply - 1` ms (the waiter's fallback timer);
/// * `0`: the key is held without expiry (set by some other client).
///
/// The `SET NX PX` comes first and alone decides. The `INCR` after it runs under `pcall`: a
/// script that fails halfway keeps what it already did (Redis has no rollback), so if the
/// counter cannot be raised (overwritten with text, or at its maximum) the fresh lease is
/// deleted again before the error is returned, and nobody holds a lease nobody was told about.
pub(crate) const ACQUIRE: &str = r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.pcall('INCR', KEYS[2])
  if type(fence) == 'table' then
    redis.call('DEL', KEYS[1])
  end
  return fence
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then
  return 0
end
return -1 - pttl
"#;

/// Renew: extend only if the lock key still holds our owner token. `KEYS[1]` the lock key;
/// `ARGV[1]` the owner token, `ARGV[2]` the TTL in milliseconds. Returns 1 or 0.
pub(crate) const RENEW: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

/// Release: delete only if the lock key still holds our owner token, and announce it on the
/// release channel (payload: the lock key) so waiters try at once. `KEYS[1]` the lock key;
/// `ARGV[1]` the owner token, `ARGV[2]` the channel.
///
/// Returns 1 (deleted and announced), 2 (deleted, but the announcement was refused), or 0 (not
/// ours). The `PUBLISH` runs under `pcall`: an ACL user without rights on the channel (Redis
/// 7's default for new users, `acl-pubsub-default resetchannels`) can lock keys but not
/// publish, and a script that failed after its `DEL` would report an error for a release that
/// happened. Waiters find such a key free by retrying (see `acquire`).
pub(crate) const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local announced = redis.pcall('PUBLISH', ARGV[2], KEYS[1])
  if type(announced) == 'table' and announced.err then
    return 2
  end
  return 1
end
return 0
"#;

/// What [`RELEASE`] answers.
pub(crate) mod released {
    /// The key was ours; it is deleted and the release announced.
    pub(crate) const ANNOUNCED: i64 = 1;
    /// The key was ours and is deleted, but the server refused the announcement.
    pub(crate) const UNANNOUNCED: i64 = 2;
}

/// A script called by its SHA1.
///
/// The common case is one round trip: `EVALSHA`. When the server does not know the script
/// (`NOSCRIPT`: it restarted, or this is a promoted replica or a new primary) the same call is
/// sent once more as `EVAL` with the full text, which also caches it there. A `NOSCRIPT` reply
/// means the script did not run, so sending it again cannot do anything twice.
#[derive(Debug, Clone)]
pub(crate) struct LuaScript {
    code: &'static str,
    sha: String,
}

impl LuaScript {
    pub(crate) fn new(code: &'static str) -> Self {
        LuaScript {
            code,
            sha: redis::Script::new(code).get_hash().to_string(),
        }
    }

    /// Runs the script with `keys` and `args` on `con`.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        con: &mut MultiplexedConnection,
        keys: &[&str],
        args: &[&str],
    ) -> RedisResult<T> {
        let call = |command: &str, body: &str| {
            let mut cmd = redis::cmd(command);
            cmd.arg(body).arg(keys.len()).arg(keys).arg(args);
            cmd
        };
        match call("EVALSHA", &self.sha).query_async(con).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                tracing::debug!(sha = %self.sha, "script not cached on the server; sending it in full");
                call("EVAL", self.code).query_async(con).await
            }
            other => other,
        }
    }
}

/// The three scripts, hashed once per authority.
#[derive(Debug, Clone)]
pub(crate) struct Scripts {
    pub(crate) acquire: LuaScript,
    pub(crate) renew: LuaScript,
    pub(crate) release: LuaScript,
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts {
            acquire: LuaScript::new(ACQUIRE),
            renew: LuaScript::new(RENEW),
            release: LuaScript::new(RELEASE),
        }
    }
}
