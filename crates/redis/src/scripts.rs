//! The Lua scripts, and running them by SHA with the full text as the fallback.

use redis::{
    ErrorKind, FromRedisValue, ParsingError, RedisResult, ServerErrorKind, ToRedisArgs, Value,
};

/// Acquire, one atomic step. `KEYS[1]` the lock key, `KEYS[2]` the fence counter; `ARGV[1]` the
/// owner token, `ARGV[2]` the TTL in milliseconds. A waiter (in `acquire`) adds `KEYS[3]` the
/// key's waiter queue, `ARGV[3]` its authority's waiter id and `ARGV[4]` how long, in
/// milliseconds, its place in the queue lasts unless it tries again.
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
///
/// A key that already holds *this* attempt's owner token (fresh for every attempt) was taken by
/// this very call, run once before: the Redis Cluster client sends a request again after a
/// connection it had to repair, and the first run's answer may have been lost with it. Then the
/// script answers the fence of that run (the counter: nobody raises it while the key is held)
/// instead of "held", so the caller gets the grant it made rather than a lease nobody knows of.
///
/// A waiter that finds the key held takes (or keeps) a place in the waiter queue, a sorted set
/// scored by the server time (ms) its place runs out; the queue itself expires with its last
/// place. A waiter that wins leaves it. See [`RELEASE`] for what the queue is for.
pub(crate) const ACQUIRE: &str = r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.pcall('INCR', KEYS[2])
  if type(fence) == 'table' then
    redis.call('DEL', KEYS[1])
  elseif ARGV[3] then
    redis.call('ZREM', KEYS[3], ARGV[3])
  end
  return fence
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local fence = tonumber(redis.call('GET', KEYS[2]))
  if fence == nil then
    return redis.error_reply('the fence counter is not an integer')
  end
  return fence
end
if ARGV[3] then
  local now = redis.call('TIME')
  local until_ms = now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ARGV[4])
  redis.call('ZADD', KEYS[3], string.format('%.0f', until_ms), ARGV[3])
  redis.call('PEXPIRE', KEYS[3], ARGV[4])
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then
  return 0
end
return -1 - pttl
"#;

/// Acquire a set, one atomic step, all keys or none. `KEYS[2i-1]` the `i`th lock key and
/// `KEYS[2i]` its fence counter; `ARGV[1]` the TTL in milliseconds, `ARGV[i+1]` the `i`th owner
/// token (fresh for every key of every attempt).
///
/// Returns an array of integers: the fences in key order (each its own counter after `INCR`,
/// as [`ACQUIRE`] takes it) when every lock key was absent and is now ours; empty when any lock
/// key exists (held by leasehold or by any client of the plain `SET NX PX` convention, with or
/// without expiry), and then nothing was written.
///
/// Every key is checked before any is written, so "held" takes nothing. As in [`ACQUIRE`] the
/// `INCR`s run under `pcall`: if a counter cannot be raised, every lock key this run set is
/// deleted again before the error is returned.
///
/// A first lock key that holds this attempt's own token was taken by this very call, run once
/// before (the Redis Cluster client sends a request again after a connection it had to repair):
/// if every key still holds its token, the script answers that run's fences; if some expired in
/// between, it deletes the rest (nobody was told of them) and answers "held".
pub(crate) const ACQUIRE_ALL: &str = r#"
local n = #KEYS / 2
if redis.call('GET', KEYS[1]) == ARGV[2] then
  local fences = {}
  local whole = true
  for i = 1, n do
    local fence = nil
    if redis.call('GET', KEYS[2 * i - 1]) == ARGV[i + 1] then
      fence = tonumber(redis.call('GET', KEYS[2 * i]))
    end
    if fence == nil then
      whole = false
    else
      fences[i] = fence
    end
  end
  if whole then
    return fences
  end
  for i = 1, n do
    if redis.call('GET', KEYS[2 * i - 1]) == ARGV[i + 1] then
      redis.call('DEL', KEYS[2 * i - 1])
    end
  end
  return {}
end
for i = 1, n do
  if redis.call('EXISTS', KEYS[2 * i - 1]) == 1 then
    return {}
  end
end
local fences = {}
for i = 1, n do
  redis.call('SET', KEYS[2 * i - 1], ARGV[i + 1], 'PX', ARGV[1])
  local fence = redis.pcall('INCR', KEYS[2 * i])
  if type(fence) == 'table' then
    for j = 1, i do
      redis.call('DEL', KEYS[2 * j - 1])
    end
    return fence
  end
  fences[i] = fence
end
return fences
"#;

/// Renew: extend only if the lock key still holds our owner token. `KEYS[1]` the lock key;
/// `ARGV[1]` the owner token, `ARGV[2]` the TTL in milliseconds. Returns 1 or 0.
pub(crate) const RENEW: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

/// Renew many: [`RENEW`] for each lock key in `KEYS`, with `ARGV[2i-1]` its owner token and
/// `ARGV[2i]` its TTL in milliseconds; answers one 1 (renewed) or 0 (not ours) per key, in
/// order. One round trip renews every lease a client holds (all keys must live on this one
/// server, as they do without Redis Cluster).
pub(crate) const RENEW_MANY: &str = r#"
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[2 * i - 1] then
    out[i] = redis.call('PEXPIRE', key, ARGV[2 * i])
  else
    out[i] = 0
  end
end
return out
"#;

/// The announcement of a release or a revoke, for [`RELEASE`] and [`REVOKE`]: pops the next
/// place of the waiter queue `queue` (a key, or nil), tells that waiter on its own channel
/// (`ARGV[2]:<id>`) unless it is the caller's own authority (`ARGV[3]`), and announces on the
/// release channel `ARGV[2]`; leaves `announced` false if the server refused a `PUBLISH`.
/// Expands to a string literal, so that `concat!` builds each script at compile time.
macro_rules! announce_release {
    () => {
        r#"
  local payload = KEYS[1]
  local refused = false
  if queue and redis.call('EXISTS', queue) == 1 then
    local now = redis.call('TIME')
    local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
    redis.call('ZREMRANGEBYSCORE', queue, '-inf', string.format('%.0f', now_ms))
    local next = redis.call('ZPOPMIN', queue)
    if next[1] then
      payload = KEYS[1] .. ' ' .. next[1]
      if next[1] ~= ARGV[3] then
        local told = redis.pcall('PUBLISH', ARGV[2] .. ':' .. next[1], payload)
        if type(told) == 'table' and told.err then
          refused = true
          payload = KEYS[1]
        end
      end
    end
  end
  local published = redis.pcall('PUBLISH', ARGV[2], payload)
  local announced = not refused and not (type(published) == 'table' and published.err)
"#
    };
}

/// Release: delete only if the lock key still holds our owner token, and announce it on the
/// release channel so waiters try at once. `KEYS[1]` the lock key, `KEYS[2]` the value key,
/// `KEYS[3]` the key's waiter queue; `ARGV[1]` the owner token, `ARGV[2]` the channel, `ARGV[3]`
/// (optional) the releasing authority's own waiter id.
///
/// The announcement names one waiter: the payload is the lock key, then a space and the waiter
/// id whose place in the queue runs out first (the one that has gone longest without trying),
/// taken out of the queue. It goes to that waiter's own channel, `ARGV[2]:<id>`, which only
/// its authority subscribes to, so only that process reads it and tries the key at once. It
/// also goes to the release channel, `ARGV[2]`, which only authorities with observers
/// (`wait_for_change`) and waiters of older versions subscribe to; with nobody subscribed, a
/// `PUBLISH` costs the server a lookup and reaches nobody. Announcing to every waiting process
/// sent each of them to the server for one key only one can take (with 32 processes on one
/// key, about 30 attempts per hand-off, measured with `INFO commandstats`), and even once only
/// the named one tried, every process still read every announcement. With nobody queued (a
/// waiter of an older version, or none), the payload is the lock key alone, on the release
/// channel only. Places that ran out are dropped first: a waiter that left or died is named at
/// most until its place runs out, and the others find the key meanwhile by their retry timers.
///
/// Two exceptions to the own channel. A waiter of the releasing authority itself is not told
/// there: the authority wakes its own waiters as it returns, and a second wake-up would send a
/// second attempt. And where the server refuses the own channel's `PUBLISH` (an ACL user with
/// rights on the release channel alone), the release channel's copy names nobody, so that the
/// processes reading it hand out a turn; the named place is spent, and the others find the key
/// by their retry timers.
///
/// The value key is deleted with the lease: it can only be ours or an earlier grant's (the
/// token matched, so nobody holds a later grant), and deleting it keeps a released lock down to
/// its counter. A release by a plain peer leaves it behind, which is harmless: inspect shows a
/// value only while its fence is the holder's.
///
/// Returns 1 (deleted and announced), 2 (deleted, but the announcement was refused), or 0 (not
/// ours). The `PUBLISH` runs under `pcall`: an ACL user without rights on the channel (Redis
/// 7's default for new users, `acl-pubsub-default resetchannels`) can lock keys but not
/// publish, and a script that failed after its `DEL` would report an error for a release that
/// happened. Waiters find such a key free by retrying (see `acquire`).
pub(crate) const RELEASE: &str = concat!(
    r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  local queue = KEYS[3]
"#,
    announce_release!(),
    r#"
  if not announced then
    return 2
  end
  return 1
end
return 0
"#
);

/// Proclaim: attach a value to our grant, only if the lock key still holds our owner token (the
/// same check as [`RENEW`]: the token is new for every grant, so it names this grant), and
/// announce it on the release channel (payload: the lock key) so observers read again at once.
/// `KEYS[1]` the lock key, `KEYS[2]` the value key; `ARGV[1]` the owner token, `ARGV[2]` the
/// grant's fence (the counter value its acquisition returned), `ARGV[3]` the value (any bytes),
/// `ARGV[4]` the channel.
///
/// The value is stored with the fence, in one hash, so that inspect can tell this grant's value
/// from an earlier one's without a TTL. Returns 1 (stored and announced), 2 (stored, but the
/// announcement was refused, as in [`RELEASE`]), or 0 (not ours: nothing written).
pub(crate) const PROCLAIM: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('HSET', KEYS[2], 'fence', ARGV[2], 'value', ARGV[3])
  local announced = redis.pcall('PUBLISH', ARGV[4], KEYS[1])
  if type(announced) == 'table' and announced.err then
    return 2
  end
  return 1
end
return 0
"#;

/// Revoke: an operator ends the lease of the holder it read, only if the lock key still holds
/// that holder's owner token (a client that sends the script again after a repaired connection
/// cannot end a later holder), and announces it as [`RELEASE`] does, naming the next waiter in
/// the queue on its own channel. The fence counter is left as it is, so the next grant's fence
/// is greater. `KEYS[1]` the lock key, `KEYS[2]` the value key, `KEYS[3]` the fence counter,
/// `KEYS[4]` the key's waiter queue; `ARGV[1]` the holder's owner token, `ARGV[2]` the channel,
/// `ARGV[3]` the revoking authority's own waiter id.
///
/// Returns the holder's fence (deleted and announced), its negation (deleted, the announcement
/// refused), or 0 (that holder is gone: nothing changed).
pub(crate) const REVOKE: &str = concat!(
    r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local fence = tonumber(redis.call('GET', KEYS[3]))
  if fence == nil then
    return redis.error_reply('the fence counter is not an integer')
  end
  redis.call('DEL', KEYS[1], KEYS[2])
  local queue = KEYS[4]
"#,
    announce_release!(),
    r#"
  if not announced then
    return -fence
  end
  return fence
end
return 0
"#
);

/// What [`RELEASE`] and [`PROCLAIM`] answer.
pub(crate) mod released {
    /// The key was ours; it is deleted (or its value stored) and that announced.
    pub(crate) const ANNOUNCED: i64 = 1;
    /// The key was ours and is deleted (or its value stored), but the server refused the
    /// announcement.
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
    code: std::sync::Arc<str>,
    sha: String,
}

impl LuaScript {
    pub(crate) fn new(code: &str) -> Self {
        LuaScript {
            code: code.into(),
            sha: redis::Script::new(code).get_hash().to_string(),
        }
    }

    /// The script with every `PUBLISH` replaced by `SPUBLISH` (sharded pub/sub, for Redis
    /// Cluster: the channel must be in the slot of the script's keys).
    pub(crate) fn sharded(code: &str) -> Self {
        LuaScript::new(&code.replace("'PUBLISH'", "'SPUBLISH'"))
    }

    /// Runs the script with `keys` and `args` on `con` (arguments as text, or as bytes where a
    /// value need not be UTF-8).
    pub(crate) async fn run<T: FromRedisValue, A: ToRedisArgs + Sync, C>(
        &self,
        con: &mut C,
        keys: &[&str],
        args: &[A],
    ) -> RedisResult<T>
    where
        C: redis::aio::ConnectionLike + Send,
    {
        let call = |command: &str, body: &str| {
            let mut cmd = redis::cmd(command);
            cmd.arg(body).arg(keys.len()).arg(keys).arg(args);
            cmd
        };
        match call("EVALSHA", &self.sha).query_async(con).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                tracing::debug!(sha = %self.sha, "script not cached on the server; sending it in full");
                call("EVAL", &self.code).query_async(con).await
            }
            other => other,
        }
    }
}

/// A script's integer reply, read strictly.
///
/// Every script answers with RESP integers only. The client library would also read a bulk or
/// status string such as `"7"` as the integer 7, so a reply that no Redis running these scripts
/// sends (a proxy's garbage, a wrong server) could become a grant or a renewal; here it is a
/// type error instead, which keeps the acquisition's release armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Int(pub(crate) i64);

impl FromRedisValue for Int {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::Int(n) => Ok(Int(n)),
            other => Err(format!(
                "a script answered {} where an integer was due",
                kind(&other)
            )
            .into()),
        }
    }
}

/// A script's array of integers (`renew_many`'s reply), read strictly: an array, each item a
/// RESP integer (see [`Int`]). The caller checks that there is one per grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ints(pub(crate) Vec<i64>);

impl FromRedisValue for Ints {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::Array(items) => items
                .into_iter()
                .map(|item| Int::from_redis_value(item).map(|Int(n)| n))
                .collect::<Result<Vec<_>, _>>()
                .map(Ints),
            other => {
                Err(format!("a script answered {} where an array was due", kind(&other)).into())
            }
        }
    }
}

/// What kind of reply `v` is, for an error message (never its content: it may be anything).
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Nil => "nil",
        Value::Int(_) => "an integer",
        Value::BulkString(_) => "a bulk string",
        Value::Array(_) => "an array",
        Value::SimpleString(_) => "a status",
        Value::Okay => "OK",
        _ => "another type",
    }
}

/// The scripts, hashed once per authority.
#[derive(Debug, Clone)]
pub(crate) struct Scripts {
    pub(crate) acquire: LuaScript,
    pub(crate) acquire_all: LuaScript,
    pub(crate) renew: LuaScript,
    pub(crate) renew_many: LuaScript,
    pub(crate) release: LuaScript,
    pub(crate) proclaim: LuaScript,
    pub(crate) revoke: LuaScript,
}

impl Scripts {
    /// The scripts; with `sharded`, release and proclaim announce with `SPUBLISH` on the lock's
    /// shard channel (Redis Cluster) instead of `PUBLISH`.
    pub(crate) fn new(sharded: bool) -> Self {
        let announcing = |code: &str| {
            if sharded {
                LuaScript::sharded(code)
            } else {
                LuaScript::new(code)
            }
        };
        Scripts {
            acquire: LuaScript::new(ACQUIRE),
            acquire_all: LuaScript::new(ACQUIRE_ALL),
            renew: LuaScript::new(RENEW),
            renew_many: LuaScript::new(RENEW_MANY),
            release: announcing(RELEASE),
            proclaim: announcing(PROCLAIM),
            revoke: announcing(REVOKE),
        }
    }
}
