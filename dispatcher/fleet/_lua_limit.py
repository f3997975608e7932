"""The Lua scripts of what a fleet shares besides holds: a server's adaptive limit (LIMIT) and its retry budget (SPEND).

`READ_LIMIT` is the reading of the limit's hash that both LIMIT and the hold scripts (`_lua`, which admit
no more holds than the level) share: whatever another writer left there, the level stays within its bounds
and a pause within `MAX_PAUSE_MS`.
"""

from __future__ import annotations

__all__ = ["LIMIT", "MAX_PAUSE_MS", "READ_LIMIT", "SPEND"]

MAX_PAUSE_MS = 3_600_000
"""The longest pause of the fleet's calls a Retry-After can ask for (LIMIT's ``"pause"``), and the most
of one read back from Redis: an hour, whatever a process or the hash says."""

READ_LIMIT = """
-- The fleet's shared adaptive limit (a HASH: bounds, level, epoch, pause_until, pause_at, cut_at), read so
-- that nothing found there takes the level outside its bounds. Its `bounds` ("floor:ceiling:initial") are
-- the first process's (a caller still admits no more than its own ceiling: ACQUIRE): valid ones there
-- replace the caller's. A level that is not a finite number is the initial level, an epoch that is not a
-- whole number from 0 to 1e15 is 0, a pause that is not a finite time is none, and what is left of a pause
-- is at most MAX_PAUSE ms, and none when it was set (`pause_at`) later than Redis' clock now (the clock
-- went back: else it would last as long as the step). A key of another type reads as none.
-- Returns floor, ceiling, initial, whether the bounds were found, level, epoch, the pause left (ms), the
-- lowest level (the smaller of the two floors).
local function whole_number(text, low, high)
  local n = tonumber(text or '')
  if n and n >= low and n <= high and n == math.floor(n) then return n end
  return nil
end

local function finite(n)
  return n ~= nil and n == n and n > -math.huge and n < math.huge
end

local function read_limit(key, floor, ceiling, initial, now)
  local got = {}
  if redis.call('TYPE', key)['ok'] == 'hash' then
    got = redis.call('HMGET', key, 'bounds', 'level', 'epoch', 'pause_until', 'pause_at')
  end
  local f, c, i = string.match(got[1] or '', '^(%d+):(%d+):(%d+)$')
  f, c, i = whole_number(f, 1, 1e9), whole_number(c, 1, 1e9), whole_number(i, 1, 1e9)
  local known = f ~= nil and c ~= nil and i ~= nil and f <= i and i <= c
  -- The lowest level: never above the caller's floor (the fleet's bounds may narrow what it admits,
  -- never hold a cut up).
  local low = floor
  if known then floor, ceiling, initial, low = f, c, i, math.min(f, floor) end
  local level = tonumber(got[2] or '')
  if not finite(level) then level = initial end
  level = math.min(ceiling, math.max(low, level))
  local epoch = whole_number(got[3], 0, 1e15) or 0
  local pause, since = tonumber(got[4] or ''), tonumber(got[5] or '')
  local left = 0
  if finite(pause) and pause > now then left = math.min(pause - now, MAX_PAUSE) end
  -- Set later than Redis' clock now: the clock went back, and the pause would last as long as the step.
  if finite(since) and since > now then left = 0 end
  return floor, ceiling, initial, known, level, epoch, math.floor(left), low
end
""".replace("MAX_PAUSE", str(MAX_PAUSE_MS))

SPEND = """
-- A shared retry budget (a token bucket). KEYS[1] the bucket; ARGV[1] capacity, ARGV[2] tokens earned
-- since the last call, ARGV[3] 1 to take one token for a retry, 0 only to add the earnings.
-- Returns 1 when a token was taken.
local capacity = tonumber(ARGV[1])
-- A key of another type, or tokens that are not a finite number (written by something else), count as
-- gone: the bucket starts again full, as after a DEL.
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then redis.call('DEL', KEYS[1]) end
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens') or '')
if tokens == nil or tokens ~= tokens or tokens == math.huge or tokens == -math.huge then tokens = capacity end
tokens = math.min(capacity, math.max(0, tokens) + tonumber(ARGV[2]))
local taken = 0
if ARGV[3] == '1' and tokens >= 1 then
  tokens = tokens - 1
  taken = 1
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens))
return taken
"""

LIMIT = (
    READ_LIMIT
    + """
-- A server's shared adaptive limit (KEYS[1], a HASH: bounds, level, epoch, pause_until, pause_at, cut_at).
-- ARGV[1] floor, ARGV[2] ceiling, ARGV[3] initial (the caller's: the hash's own bounds, once set, win), ARGV[4]
-- 'read', 'cut', 'grow' or 'pause', ARGV[5] the epoch the call that reports it was sent under, ARGV[6]
-- for a cut the factor (0 < f < 1) its controller cut its own level by, for a growth the calls its
-- controller added (> 0), for a pause the seconds a trusted server's Retry-After asked for (> 0, at
-- most an hour counted); ARGV[7], for a growth, the most it may take the level to (its controller's slow
-- start allows no more than what is proven: two processes growing from the same level do not add up
-- past it; 'inf' or absent: no bound). Returns {level, epoch, 1 if applied else 0, pause left (ms), bounds}.
--
-- A cut applies only to the epoch it was sent under, and starts the next one: calls sent before it
-- report the load it answered, and cannot cut again, from whichever process (one cut per round for
-- the fleet). A growth applies under its own epoch only too (a call sent before a cut says nothing of
-- the limit since). Each growth is one answer's, sent by the one process that got it: the fleet's
-- level grows by what one controller seeing all the fleet's answers would add, not that times the
-- processes. A value that is not a finite number moves nothing.
local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local kind = redis.call('TYPE', key)['ok']
if kind ~= 'hash' and kind ~= 'none' then redis.call('DEL', key) end  -- not ours to read: start again
local floor, ceiling, initial, known, level, epoch, left, low =
  read_limit(key, tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), now)
local op, sent, value = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local applied = 0
if not finite(value) or not finite(sent) then
  op = 'read'
end
if op == 'cut' and sent == epoch and value > 0 and value < 1 then
  -- The factor is of the caller's own level, which is never above its ceiling (ARGV[2]).
  level = math.max(low, math.floor(math.min(level, tonumber(ARGV[2])) * value + 1e-9))
  epoch = epoch + 1
  applied = 1
  redis.call('HSET', key, 'cut_at', now)
elseif op == 'grow' and sent == epoch and value > 0 then
  local top = tonumber(ARGV[7])
  local grown = math.min(ceiling, level + value)
  if top ~= nil and top == top and top < grown then grown = math.max(level, top) end
  level = grown
  applied = 1
elseif op == 'pause' and value > 0 then
  local wanted = math.floor(math.min(value * 1000, MAX_PAUSE))
  if wanted > left then
    left = wanted
    redis.call('HSET', key, 'pause_until', string.format('%.0f', now + wanted),
      'pause_at', string.format('%.0f', now))
  end
  applied = 1
end
local shown, bounds = string.format('%.6f', level), string.format('%.0f:%.0f:%.0f', floor, ceiling, initial)
redis.call('HSET', key, 'bounds', bounds, 'level', shown, 'epoch', string.format('%.0f', epoch))
return {shown, epoch, applied, left, bounds}
"""
).replace("MAX_PAUSE", str(MAX_PAUSE_MS))
