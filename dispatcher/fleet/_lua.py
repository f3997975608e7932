"""The Lua scripts that admit, renew and release fleet holds atomically inside Redis.

Every script works on one server's keys (all declared in KEYS, so each runs as one atomic step):

    KEYS[1] queue        ZSET  lease id -> arrival number   (waiting holds, oldest first)
    KEYS[2] waiting      HASH  lease id -> locks            (what each waiting hold asks for)
    KEYS[3] waiting_exp  ZSET  lease id -> expiry (ms)      (a waiter that stops checking in is dropped)
    KEYS[4] holders      HASH  lease id -> locks            (granted holds)
    KEYS[5] holders_exp  ZSET  lease id -> expiry (ms)      (a holder that stops renewing is dropped)
    KEYS[6] seq          STRING  the arrival counter
    KEYS[7] meta         HASH  run_id, quiet_until (ms), epoch, held, waiting: see below
    KEYS[8] tokens       HASH  lease id -> fencing token    (of the granted holds)
    KEYS[9] fence        STRING  the last fencing token granted
    KEYS[10] limit       HASH  bounds, level, epoch, pause_until, pause_at, cut_at (ms): the fleet's
                               shared adaptive limit (see LIMIT)

    ARGV[1] lease ttl (ms), ARGV[2] the server's limit (0: none;
    ``auto:<floor>:<ceiling>:<initial>:<cap>:<probe>`` for a shared adaptive limit: the level in
    KEYS[10] within the bounds found there (else these), `initial` while it has none, at most this
    caller's `ceiling` whatever the bounds found there, at most `cap` unless 0, plus `probe` (0 or 1):
    one call past the level, asked by a process whose controller probes),
    ARGV[3] the wake-up channel prefix, ARGV[4] the server's max write time (ms; 0: none), ARGV[5] its
    max call time (ms; 0: none).

A hold's *locks* are those of `_gate` (multi-granularity locking over the call's conflict keys), as a JSON
list ``[path, mode, path, mode, ...]`` with the modes 0 IS, 1 IX, 2 S, 3 X: a read takes S on each key
and IS on its ancestors, a write X and IX. Two holds conflict when they hold incompatible modes on one
path; a call on the root key ``""`` (every call of a server without keys) conflicts with every write.
The Python side computes the locks with `_gate`'s own function, so the two agree by construction.

Time is Redis' own clock (TIME), so the processes' clocks never need to agree. Grants follow arrival
order as the gate's do: walking the queue from the oldest waiter, a waiter is granted when no hold and
no *older waiter* conflicts with it and the limit has room; one that cannot start blocks, for the rest
of the walk, whatever conflicts with it, so nothing overtakes a waiting call it conflicts with (a queued
write is never overtaken by later reads of its keys) while writes on other keys go ahead. The walk stops
when the limit is reached, when a waiting write on the root key blocks everything after it, or after
`WALK` waiters. Each grant is PUBLISHed on the owner's channel (prefix .. the part of the lease id
before ":") to wake its waiting task.

A write's turn. A hold with an X lock (a write) is kept in Redis for the max write time beyond its lease
(`holders_exp` is its renewal plus ttl plus that time), and a write whose holder gives it up after its
request was sent (its lease lost) is released by keeping it that long from then (RELEASE's ARGV[7]):
a holder killed, frozen or cut off in the middle of a write does not hand its turn on while the write
it sent may still run on the server. The holder itself counts its lease as ttl only.

A call's place under a limit. On a server with a limit, every hold is kept the max call time beyond its
lease (a write the longer of the two times), and a call given up after its request was sent keeps its
place for ttl plus the max call time from then (RELEASE's ARGV[7]): as long as the place of a holder
killed at that moment, so a call that may still run on the server still counts against its limit.

Fencing tokens. Every grant takes the next number of the server's `fence` counter: the larger of the last
token plus one and Redis' clock in microseconds (TIME). The counter never goes back while its key lives,
and when the key is gone (a FLUSHALL, an eviction, a Redis restarted empty) the next token is still larger
than every token granted before, as long as Redis' clock has not gone back by more than the time since the
last grant: the tokens a resource has seen stay below the new ones. A `fence` that is not a whole number
up to MAX_TOKEN, or is at it, counts as gone too (junk from another writer; past it the + 1 is lost in
a double and every grant would repeat one token). Holds that conflict are granted one
after the other, so a resource that refuses a token lower than the highest it has seen refuses the
requests of a holder whose turn was handed on.

The quiet period. A Redis that lost the holders (a restart, a failover to a replica that lacked recent
writes, a FLUSHALL, an eviction or a DEL of any of the namespace's keys) must not grant while holds still
running elsewhere are missing from it: a holder that could not renew, or that found its hold gone, gives
its call up within one ttl of its last renewal, and a write it had sent may run for the max write time
more. So `meta` remembers the run_id of the Redis instance that wrote it, the server's *epoch* (Redis'
clock when its state was created) and how many holds and waiters the state had when the last script
ended. When `meta` is missing or incomplete, or the other keys do not hold that many entries (`holders`,
`holders_exp` and `tokens` the holds, `queue`, `waiting` and `waiting_exp` the waiters: a key deleted
or evicted on its own), the state is lost: what is left of it is dropped, a new epoch begins, and nothing
is granted for ttl plus the max write time. An entry of `holders` or `waiting` that is not a lock list
(junk) is lost state too: `holders` is checked first by every script, a waiter's entry when a grant
reads it. When `meta` names another instance (a restart from a snapshot, a failover), the same quiet
period follows but the epoch stays. A holder renews with the epoch of its grant: a hold missing from
Redis under another epoch is lost (never re-registered), while under the same epoch (a replica that had
the namespace but not this hold) it is re-registered. A fresh namespace therefore waits one quiet period
before its first grant: Redis cannot tell it from one whose state vanished. A quiet period is never
shortened: it lasts the noticing process's ttl plus its max write or call time, or longer while a
quiet period already set, or a hold it drops, ends later (so a short-ttl process that notices a loss
waits out a long-ttl process's holds, as far as Redis still has them).

The horizon. No fleet process sets a time further ahead of Redis' clock than `HORIZON_MS`: the longest
`lease_ttl` (`MAX_LEASE_TTL`) plus the longest max write or call time (`MAX_OVERRUN`), the bounds the
configuration checks. A `quiet_until`, or an expiry in `holders_exp` or `waiting_exp`, further ahead
(1e300, ten years from now, +inf: written by a hostile or broken process) would hold every grant back,
or keep a dead hold in force, for as long as it stays; it is junk, and lost state like any. The bound is
one absolute number, the same for every process, rather than one drawn from the reader's own ttl: a fleet
whose processes run different `lease_ttl` values is valid, and a quiet period or an expiry that a long-ttl
process set is no junk to a short-ttl one. Storing each writer's ttl beside its time would buy nothing
against a hostile writer, which would write both; any check a writer cannot move needs a bound every
reader knows. The price: a value within the horizon cannot be told from a legitimate one, so a hostile
writer can still hold grants back for up to `HORIZON_MS` (two hours) per write.
"""

from __future__ import annotations

from ._lua_limit import LIMIT as LIMIT
from ._lua_limit import MAX_PAUSE_MS as MAX_PAUSE_MS
from ._lua_limit import READ_LIMIT
from ._lua_limit import SPEND as SPEND

__all__ = [
    "ACQUIRE",
    "HORIZON_MS",
    "LIMIT",
    "MAX_LEASE_TTL",
    "MAX_OVERRUN",
    "MAX_PAUSE_MS",
    "MAX_TOKEN",
    "RELEASE",
    "RENEW",
    "SPEND",
    "WALK",
]

WALK = 1000
"""The most waiters one grant walks past (a bound on a script's time when thousands wait)."""

MAX_TOKEN = 2**53 - 2
"""The largest fencing token read back from Redis (its `fence` counter, a hold's entry in `tokens`): past it a
double no longer counts in ones, so the next token would repeat the last. No clock in microseconds reaches
it before the year 2255; a larger value, or one that is not a whole number, was written by something other
than the fleet and counts as none."""

MAX_LEASE_TTL = 3600.0
"""The longest `lease_ttl` a process may be configured with (seconds)."""

MAX_OVERRUN = 3600.0
"""The longest `max_write_time` and `max_call_time` a server may be configured with (seconds)."""

HORIZON_MS = round((MAX_LEASE_TTL + MAX_OVERRUN) * 1000)
"""How far ahead of Redis' clock a legitimate writer may set a time (ms); see the module docstring."""

_TOKEN = """
local MAX_TOKEN = MAX_TOKEN_VALUE
-- A fencing token read back from Redis: a whole number from 0 to MAX_TOKEN, else nil (junk, or a counter
-- past where a double still counts in ones: its next token would repeat it).
local function token_of(text)
  local n = tonumber(text or '')
  if n and n >= 0 and n <= MAX_TOKEN and n == math.floor(n) then return n end
  return nil
end
""".replace("MAX_TOKEN_VALUE", str(MAX_TOKEN))

_PRELUDE = (
    (
        READ_LIMIT
        + _TOKEN
        + """
local Q, W, WE, H, HE, SEQ, META = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local TOK, FENCE, LIM = KEYS[8], KEYS[9], KEYS[10]
local ttl = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local floor, ceiling, initial, cap, probe = string.match(ARGV[2], '^auto:(%d+):(%d+):(%d+):(%d+):(%d)$')
-- A shared adaptive limit: the fleet's level now (LIMIT moves it), its epoch, the pause left (ms) and
-- the fleet's bounds, as strings.
local shared_level, shared_epoch, shared_pause, shared_bounds = '', '', '', ''
if initial then
  local f, c, i, _, level, shared, left = read_limit(LIM, tonumber(floor), tonumber(ceiling), tonumber(initial), now)
  shared_level, shared_epoch = string.format('%.6f', level), string.format('%.0f', shared)
  shared_pause, shared_bounds = string.format('%.0f', left), string.format('%.0f:%.0f:%.0f', f, c, i)
  limit = math.max(1, math.floor(level + 1e-9))  -- whole calls, at least 1
  -- Never past the caller's own ceiling: the fleet's bounds (the first writer's) may narrow it, not widen it.
  limit = math.min(limit, tonumber(ceiling))
  if tonumber(cap) > 0 then limit = math.min(limit, tonumber(cap)) end
  limit = limit + tonumber(probe)
end
local prefix = ARGV[3]
local extra = tonumber(ARGV[4])
local callx = tonumber(ARGV[5])
if limit == 0 then callx = 0 end  -- a call's place is kept only under a limit
-- The furthest ahead a fleet process sets a time (module docstring: the horizon); past it, junk.
local HORIZON = HORIZON_VALUE
local horizon = string.format('%.0f', now + HORIZON)
-- Microseconds since the epoch (about 1.8e15) are exact in Lua's doubles (up to 9e15).
local micros = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- BLOCKERS[m]: the modes held on a path that a lock of mode m cannot share it with (as in _gate).
local BLOCKERS = {[0] = {3}, [1] = {2, 3}, [2] = {1, 3}, [3] = {0, 1, 2, 3}}

-- A hold's locks read back from Redis: the list [path, mode, ...] the fleet writes (a string and a mode 0
-- to 3 in each pair, at least one pair), else nil (junk: not JSON, an object, a path or mode of another kind).
local function locks_of(spec)
  local ok, locks = pcall(cjson.decode, spec or '')
  if not ok or type(locks) ~= 'table' or #locks == 0 or #locks % 2 ~= 0 then return nil end
  local n = 0
  for _ in pairs(locks) do n = n + 1 end
  if n ~= #locks then return nil end
  for i = 1, #locks, 2 do
    if type(locks[i]) ~= 'string' or not BLOCKERS[locks[i + 1]] then return nil end
  end
  return locks
end

-- Whether the state is whole: meta complete, each key holding as many entries as meta says, and each
-- holder's entry a lock list (a waiter's is checked where a grant reads it).
local function whole(seen)
  local quiet = tonumber(seen[2] or '')
  if not finite(quiet) or quiet > now + HORIZON or not seen[3] then return false end
  for _, expiries in ipairs({HE, WE}) do
    if #redis.call('ZRANGEBYSCORE', expiries, '(' .. horizon, '+inf', 'LIMIT', 0, 1) > 0 then return false end
  end
  local held, waiting = tonumber(seen[4] or '0'), tonumber(seen[5] or '0')
  if not (redis.call('HLEN', H) == held and redis.call('ZCARD', HE) == held and redis.call('HLEN', TOK) == held
    and redis.call('ZCARD', Q) == waiting and redis.call('HLEN', W) == waiting
    and redis.call('ZCARD', WE) == waiting) then return false end
  for _, spec in ipairs(redis.call('HVALS', H)) do
    if not locks_of(spec) then return false end
  end
  return true
end

-- The Redis instance: a Redis that refuses INFO (renamed away on some managed services) is taken for one
-- instance, so a failover there goes unnoticed; a loss of state is noticed all the same.
local function instance()
  local info = redis.pcall('INFO', 'server')
  if type(info) ~= 'string' then info = '' end
  return string.match(info, 'run_id:(%w+)') or 'unknown'
end

-- The end of a quiet period starting now: this process's ttl plus its longer max time, or later while
-- the one already set (`since`, from meta) ends later, within the horizon (never shortened).
local function quiet_end(since)
  local untl = now + ttl + math.max(extra, callx)
  since = tonumber(since or '')
  if finite(since) and since <= now + HORIZON then untl = math.max(untl, since) end
  return untl
end

-- The state is lost: holds running elsewhere may be missing here. What is left is dropped, so that the
-- state is whole again under a new epoch (its holders lose their holds at their next renewal), and
-- nothing is granted until the quiet period it returns the end of is over: at the earliest when the
-- last hold it drops would have expired (a long-ttl process's, within the horizon).
local function lose(since)
  local last = redis.call('ZREVRANGEBYSCORE', HE, horizon, now, 'WITHSCORES', 'LIMIT', 0, 1)
  local untl = quiet_end(since)
  if last[2] then untl = math.max(untl, tonumber(last[2])) end
  redis.call('DEL', Q, W, WE, H, HE, TOK)
  redis.call('HSET', META, 'run_id', instance(), 'quiet_until', untl, 'epoch', string.format('%.0f', micros),
    'held', 0, 'waiting', 0)
  return untl
end

-- Run first by every script: notices a state that was lost, in part or whole, or written by another
-- instance, and starts the quiet period (module docstring). Returns whether it is on.
local function check()
  -- A key of another type than the fleet's (written by something else) is dropped, as if deleted: what it
  -- held is then missing, and noticed below like any key lost on its own.
  for _, owned in ipairs({{Q, 'zset'}, {W, 'hash'}, {WE, 'zset'}, {H, 'hash'}, {HE, 'zset'}, {SEQ, 'string'},
      {META, 'hash'}, {TOK, 'hash'}, {FENCE, 'string'}}) do
    local kind = redis.call('TYPE', owned[1])['ok']
    if kind ~= owned[2] and kind ~= 'none' then redis.call('DEL', owned[1]) end
  end
  local run_id = instance()
  local seen = redis.call('HMGET', META, 'run_id', 'quiet_until', 'epoch', 'held', 'waiting')
  local untl = seen[2]
  if not whole(seen) then
    untl = lose(untl)
  elseif seen[1] ~= run_id then
    -- Written by another instance (a snapshot, a replica): it may lack recent holds; the epoch stays.
    untl = quiet_end(untl)
    redis.call('HSET', META, 'run_id', run_id, 'quiet_until', untl)
  end
  return now < tonumber(untl)
end

-- Run last by every script that changes the state: how many holds and waiters it has now.
local function seal()
  redis.call('HSET', META, 'held', redis.call('HLEN', H), 'waiting', redis.call('ZCARD', Q))
end

-- The next arrival number: after both the counter and the newest waiter's, so that a counter that was
-- deleted or holds junk (not a whole number a double counts exactly) never lets a later waiter go first.
local function arrival()
  local last = token_of(redis.call('GET', SEQ)) or 0
  local newest = redis.call('ZRANGE', Q, -1, -1, 'WITHSCORES')
  local after = token_of(newest[2]) or 0
  local number = math.max(last, after) + 1
  if number > MAX_TOKEN then number = 1 end  -- past that the + 1 is lost: order, never an error
  redis.call('SET', SEQ, string.format('%.0f', number))
  return number
end

local function epoch()
  return redis.call('HGET', META, 'epoch')
end

-- How long beyond its lease a hold with these locks is kept: a write's turn `extra`, a call's place
-- under the limit `callx` (the longer of the two).
local function beyond(locks)
  if extra > callx then
    for i = 2, #locks, 2 do
      if locks[i] == 3 then return extra end
    end
  end
  return callx
end

-- When a hold with these locks ends if not renewed.
local function expiry(locks)
  return now + ttl + beyond(locks)
end

local function purge()
  -- One by one: unpack() of a long list would overflow Lua's stack after a mass crash.
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', HE, '-inf', now)) do
    redis.call('HDEL', H, id)
    redis.call('HDEL', TOK, id)
  end
  redis.call('ZREMRANGEBYSCORE', HE, '-inf', now)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', WE, '-inf', now)) do
    redis.call('HDEL', W, id)
    redis.call('ZREM', Q, id)
  end
  redis.call('ZREMRANGEBYSCORE', WE, '-inf', now)
end

local function blocked(taken, locks)
  for i = 1, #locks, 2 do
    local node = taken[locks[i]]
    if node then
      for _, mode in ipairs(BLOCKERS[locks[i + 1]]) do
        if (node[mode] or 0) > 0 then return true end
      end
    end
  end
  return false
end

local function take(taken, locks)
  for i = 1, #locks, 2 do
    local path, mode = locks[i], locks[i + 1]
    local node = taken[path]
    if not node then
      node = {}
      taken[path] = node
    end
    node[mode] = (node[mode] or 0) + 1
  end
end

-- The locks of the holds in force (each a lock list: check() made sure), and how many there are.
local function state()
  local taken = {}
  local count = 0
  for _, spec in ipairs(redis.call('HVALS', H)) do
    take(taken, locks_of(spec) or {'', 3})
    count = count + 1
  end
  return taken, count
end

local function room(count)
  return limit == 0 or count < limit
end

local function hold(id, spec, locks)
  redis.call('HSET', H, id, spec)
  redis.call('ZADD', HE, expiry(locks), id)
  -- A `fence` that is no token, or at the cap, counts as gone (as after a FLUSHALL): the next token is
  -- Redis' clock, never the cap's repeat.
  local last = token_of(redis.call('GET', FENCE)) or 0
  if last >= MAX_TOKEN then last = 0 end
  local token = string.format('%.0f', math.max(last + 1, micros))
  redis.call('SET', FENCE, token)
  redis.call('HSET', TOK, id, token)
end

local function grant(quiet_now)
  if quiet_now then return end
  local taken, count = state()
  local ahead = {}  -- the locks of older waiters that were not granted
  local start = 0
  local walked = 0
  while room(count) and walked < WALK do
    local ids = redis.call('ZRANGE', Q, start, start + 63)
    if #ids == 0 then return end
    start = start + #ids
    for _, id in ipairs(ids) do
      if not room(count) or walked >= WALK then return end
      walked = walked + 1
      local spec = redis.call('HGET', W, id)
      if not spec then
        -- A stale queue entry (its waiter expired): dropped.
        redis.call('ZREM', Q, id)
        redis.call('ZREM', WE, id)
        start = start - 1
      else
        local locks = locks_of(spec)
        -- Junk for a waiter's locks: lost state, as junk in any key (what this walk granted goes too).
        if not locks then
          lose(redis.call('HGET', META, 'quiet_until'))
          return
        end
        if blocked(taken, locks) or blocked(ahead, locks) then
          take(ahead, locks)
          local root = ahead['']
          if root and (root[3] or 0) > 0 then return end
        else
          redis.call('ZREM', Q, id)
          redis.call('HDEL', W, id)
          redis.call('ZREM', WE, id)
          start = start - 1
          hold(id, spec, locks)
          take(taken, locks)
          count = count + 1
          local owner = string.match(id, '^([^:]+):')
          if owner then redis.call('PUBLISH', prefix .. owner, id) end
        end
      end
    end
  end
end
"""
    )
    .replace("WALK", str(WALK))
    .replace("HORIZON_VALUE", str(HORIZON_MS))
)

ACQUIRE = (
    _PRELUDE
    + """
-- ARGV[6] lease id, ARGV[7] its locks. Returns {1, fencing token, epoch, holds in force (this one
-- included), shared level, its epoch, the fleet's pause left (ms), its bounds} when the hold is granted
-- ('' for the last four without a shared limit), {0} while it waits.
local id, spec = ARGV[6], ARGV[7]
local quiet_now = check()
purge()
local function granted()
  -- A token changed under the hold into junk reads as 0, which a fencing server refuses (the safe side).
  local token = token_of(redis.call('HGET', TOK, id))
  return {1, string.format('%.0f', token or 0), epoch() or '0', redis.call('HLEN', H), shared_level, shared_epoch,
    shared_pause, shared_bounds}
end
if redis.call('HEXISTS', H, id) == 1 then
  redis.call('ZADD', HE, expiry(cjson.decode(spec)), id)
  seal()
  return granted()
end
if redis.call('HEXISTS', W, id) == 0 then
  redis.call('ZADD', Q, arrival(), id)
  redis.call('HSET', W, id, spec)
end
redis.call('ZADD', WE, now + ttl, id)
grant(quiet_now)
seal()
if redis.call('HEXISTS', H, id) == 1 then return granted() end
return {0}
"""
)

RELEASE = (
    _PRELUDE
    + """
-- ARGV[6] lease id: gives a hold back, or leaves the queue. With ARGV[7] '1' (a call given up after its
-- request was sent), a write's turn is kept for the max write time from now instead, and on a server
-- with a limit the call's place for ttl plus the max call time from now. Returns 1.
local id = ARGV[6]
local quiet_now = check()
local spec = redis.call('HGET', H, id)
local kept = false
if ARGV[7] == '1' and spec then
  local ends = now + beyond(locks_of(spec) or {'', 3})
  if limit > 0 then ends = math.max(ends, now + ttl + callx) end
  if ends > now then
    -- GT: never earlier than its lease already ends.
    redis.call('ZADD', HE, 'GT', ends, id)
    kept = true
  end
end
if not kept then
  redis.call('HDEL', H, id)
  redis.call('HDEL', TOK, id)
  redis.call('ZREM', HE, id)
end
redis.call('ZREM', Q, id)
redis.call('HDEL', W, id)
redis.call('ZREM', WE, id)
purge()
grant(quiet_now)
seal()
return 1
"""
)

RENEW = (
    _PRELUDE
    + """
-- ARGV[6], ARGV[7], ARGV[8], ...: lease id, locks, epoch of the grant, for each hold in force. Returns one
-- flag per hold: 1 renewed, 0 lost (it had expired here and its place was taken meanwhile, or the
-- server's state was lost since its grant).
local quiet_now = check()
purge()
local current = epoch()
local taken, count = state()
local out = {}
for i = 6, #ARGV, 3 do
  local id, spec, since = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local locks = cjson.decode(spec)
  if redis.call('HEXISTS', H, id) == 1 then
    redis.call('ZADD', HE, expiry(locks), id)
    out[#out + 1] = 1
  elseif since ~= current then
    -- The state it was granted in is gone: whatever Redis grants now knows nothing of this hold.
    out[#out + 1] = 0
  elseif quiet_now or (room(count) and not blocked(taken, locks)) then
    -- Re-registered: after a failover to a replica that lacked it (quiet period), or after a late
    -- renewal while it still fits.
    hold(id, spec, locks)
    take(taken, locks)
    count = count + 1
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
grant(quiet_now)
seal()
return out
"""
)
