-- mc_queue: fair_trim
-- The sweeper's drop of the passes idle fairness keys left behind (fair_pop.lua keeps an emptied key's pass
-- so that it cannot come back ahead of its turn): once the lanes' pass now (the lowest queued key's, or
-- the last one served) has reached it, a key coming back would join there anyway, so the field says nothing.
-- One HSCAN step of the lanes hash (at most ARGV count fields looked at).
-- KEYS[1] lanes      an RQ queue's fair lanes
-- KEYS[2] turns      the keys with messages queued -> their pass
-- ARGV[1] cursor     HSCAN cursor ('0' to start)
-- ARGV[2] count      fields to look at (HSCAN COUNT)
-- Returns: {'OK', dropped, next cursor ('0': the whole hash was seen)} | {'E_BADARG', why}
-- Events: none
-- Idempotent: yes
--@include common

local K = {lanes = KEYS[1], turns = KEYS[2]}
local A, bad = args(ARGV, {
  'cursor', 'int', 0, MAX_INT,
  'count', 'int', 1, 10000,
})
if bad then return bad end
local low = redis.call('ZRANGE', K.turns, 0, 0, 'WITHSCORES')
local now = tonumber(low[2] or redis.call('HGET', K.lanes, 'vt') or 0)
local step = redis.call('HSCAN', K.lanes, A.raw.cursor, 'MATCH', '*|p', 'COUNT', A.count)
local dropped = 0
for i = 1, #step[2], 2 do
  if (tonumber(step[2][i + 1]) or 0) <= now then
    redis.call('HDEL', K.lanes, step[2][i])
    dropped = dropped + 1
  end
end
return {'OK', dropped, step[1]}
