-- mc_queue: due_leases
-- Read-only: the attempts whose lease expiry (Redis clock) has passed, oldest first. The caller
-- expires each with `expire`, which re-checks the condition; cost grows with expired leases only.
-- KEYS[1] leases     lease expiry index
-- ARGV[1] limit      at most this many
-- Returns: {now_ms, attempt_id, ...}
-- Idempotent: yes (read-only)
--@include common

local ts = now_ms()
local out = {ts}
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ts, 'LIMIT', 0, tonumber(ARGV[1]))) do
  out[#out + 1] = m
end
return out
