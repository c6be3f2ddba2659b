-- mc_queue: due
-- Read-only: members of a time index (lease expiries, the dispatch outbox) whose time has come by
-- Redis's clock, oldest first. The caller acts on each with a script that re-checks the
-- condition; cost grows with what is due, not with how much the index holds.
-- KEYS[1] index      a sorted set scored by time (ms, Redis clock)
-- ARGV[1] limit      at most this many
-- Returns: {now_ms, member, ...}
-- Idempotent: yes (read-only)
--@include common

local ts = now_ms()
local out = {ts}
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ts, 'LIMIT', 0, tonumber(ARGV[1]))) do
  out[#out + 1] = m
end
return out
