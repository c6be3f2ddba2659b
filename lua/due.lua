-- mc_queue: due
-- Read-only: members of a time index (lease expiries, the dispatch outbox, cancel deadlines) whose
-- time has come by Redis's clock, oldest first. The caller acts on each with a script that re-checks
-- the condition; cost grows with what is due, not with how much the index holds.
-- KEYS[1] index      a sorted set scored by time (ms, Redis clock)
-- ARGV[1] limit      at most this many
-- Returns: {now_ms, member, ...} | {'E_BADARG', why}
-- Idempotent: yes (read-only)
--@include common

local K = {index = KEYS[1]}
local A, bad = args(ARGV, {
  'limit', 'int', 1, 10000,
})
if bad then return bad end
local ts = now_ms()
local out = {ts}
for _, m in ipairs(redis.call('ZRANGEBYSCORE', K.index, '-inf', ts, 'LIMIT', 0, A.limit)) do
  out[#out + 1] = m
end
return out
