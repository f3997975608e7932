"""The Lua scripts that admit, renew and release fleet holds atomically inside Redis.

Every script works on one server's keys (all declared in KEYS, so each runs as one atomic step):

    KEYS[1] queue        ZSET  lease id -> arrival number   (waiting holds, oldest first)
    KEYS[2] waiting      HASH  lease id -> "r" | "w"        (the mode each waiting hold asks for)
    KEYS[3] waiting_exp  ZSET  lease id -> expiry (ms)      (a waiter that stops checking in is dropped)
    KEYS[4] holders      HASH  lease id -> "r" | "w"        (granted holds)
    KEYS[5] holders_exp  ZSET  lease id -> expiry (ms)      (a holder that stops renewing is dropped)
    KEYS[6] seq          STRING  the arrival counter
    KEYS[7] meta         HASH  quiet_until (ms): no grants before it, see below

    ARGV[1] lease ttl (ms), ARGV[2] the server's limit (0: none), ARGV[3] the wake-up channel prefix.

Time is Redis' own clock (TIME), so the processes' clocks never need to agree. Grants are strictly in
arrival order: the oldest waiter is granted if it fits (a read: no writer holds and the limit has room;
a write: nothing holds), then the next, and so on; the first that does not fit stops the walk, so a
queued write is never overtaken by later reads. Each grant is PUBLISHed on the owner's channel
(prefix .. the part of the lease id before ":") to wake its waiting task.

A Redis that lost its state (first use, a restart without persistence, a flush) has no `meta`: the first
script to notice starts a quiet period of one lease ttl during which nothing is granted but holders that
are still running re-register by renewing. A holder whose renewals failed for a whole ttl has given its
call up by then, so after the quiet period the holders in Redis are again exactly the holds in force.
"""

from __future__ import annotations

__all__ = ["ACQUIRE", "RELEASE", "RENEW", "SPEND"]

_PRELUDE = """
local Q, W, WE, H, HE, SEQ, META = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local ttl = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local prefix = ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function quiet()
  local untl = redis.call('HGET', META, 'quiet_until')
  if not untl then
    untl = now + ttl
    redis.call('HSET', META, 'quiet_until', untl)
  end
  return now < tonumber(untl)
end

local function purge()
  -- One by one: unpack() of a long list would overflow Lua's stack after a mass crash.
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', HE, '-inf', now)) do
    redis.call('HDEL', H, id)
  end
  redis.call('ZREMRANGEBYSCORE', HE, '-inf', now)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', WE, '-inf', now)) do
    redis.call('HDEL', W, id)
    redis.call('ZREM', Q, id)
  end
  redis.call('ZREMRANGEBYSCORE', WE, '-inf', now)
end

local function state()
  local modes = redis.call('HVALS', H)
  local writer = false
  for _, mode in ipairs(modes) do
    if mode == 'w' then writer = true end
  end
  return #modes, writer
end

local function fits(mode, count, writer)
  if mode == 'w' then return count == 0 end
  return (not writer) and (limit == 0 or count < limit)
end

local function hold(id, mode)
  redis.call('HSET', H, id, mode)
  redis.call('ZADD', HE, now + ttl, id)
end

local function grant()
  if quiet() then return end
  local count, writer = state()
  while true do
    local head = redis.call('ZRANGE', Q, 0, 0)[1]
    if not head then return end
    local mode = redis.call('HGET', W, head)
    if mode and not fits(mode, count, writer) then return end
    redis.call('ZREM', Q, head)
    redis.call('HDEL', W, head)
    redis.call('ZREM', WE, head)
    if mode then
      hold(head, mode)
      count = count + 1
      if mode == 'w' then writer = true end
      local owner = string.match(head, '^([^:]+):')
      if owner then redis.call('PUBLISH', prefix .. owner, head) end
    end
  end
end
"""

ACQUIRE = (
    _PRELUDE
    + """
-- ARGV[4] lease id, ARGV[5] mode. Returns 1 when the hold is granted, 0 while it waits.
local id, mode = ARGV[4], ARGV[5]
purge()
if redis.call('HEXISTS', H, id) == 1 then
  redis.call('ZADD', HE, now + ttl, id)
  return 1
end
if redis.call('HEXISTS', W, id) == 0 then
  redis.call('ZADD', Q, redis.call('INCR', SEQ), id)
  redis.call('HSET', W, id, mode)
end
redis.call('ZADD', WE, now + ttl, id)
grant()
return redis.call('HEXISTS', H, id)
"""
)

RELEASE = (
    _PRELUDE
    + """
-- ARGV[4] lease id: gives a hold back, or leaves the queue. Returns 1.
local id = ARGV[4]
redis.call('HDEL', H, id)
redis.call('ZREM', HE, id)
redis.call('ZREM', Q, id)
redis.call('HDEL', W, id)
redis.call('ZREM', WE, id)
purge()
grant()
return 1
"""
)

RENEW = (
    _PRELUDE
    + """
-- ARGV[4], ARGV[5], ...: lease id, mode pairs of holds in force. Returns one flag per hold: 1 renewed,
-- 0 lost (it had expired here and its place was taken meanwhile).
purge()
local quiet_now = quiet()
local count, writer = state()
local out = {}
for i = 4, #ARGV, 2 do
  local id, mode = ARGV[i], ARGV[i + 1]
  if redis.call('HEXISTS', H, id) == 1 then
    redis.call('ZADD', HE, now + ttl, id)
    out[#out + 1] = 1
  elseif quiet_now or fits(mode, count, writer) then
    -- Re-registered: after a loss of state (quiet period), or after a late renewal while it still fits.
    hold(id, mode)
    count = count + 1
    if mode == 'w' then writer = true end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
grant()
return out
"""
)

SPEND = """
-- A shared retry budget (a token bucket). KEYS[1] the bucket; ARGV[1] capacity, ARGV[2] tokens earned
-- since the last call, ARGV[3] 1 to take one token for a retry, 0 only to add the earnings.
-- Returns 1 when a token was taken.
local capacity = tonumber(ARGV[1])
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens') or capacity)
tokens = math.min(capacity, tokens + tonumber(ARGV[2]))
local taken = 0
if ARGV[3] == '1' and tokens >= 1 then
  tokens = tokens - 1
  taken = 1
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens))
return taken
"""
