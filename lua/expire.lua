-- mc_queue: expire
-- A running Attempt whose lease has passed (Redis clock) becomes suspect, not failed: the task's
-- fence is bumped so the old holder is refused from then on. Re-checks its own condition, so two
-- sweepers at once are safe. force=1 (recovery, or a cancel the executor did not acknowledge in
-- time) voids a live lease too.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] counts     "<queue>|<state>" counters
-- KEYS[3] leases     lease expiry index
-- KEYS[4] suspect    suspect index
-- KEYS[5] task       task hash
-- KEYS[6] attempts   attempts hash
-- KEYS[7] events     task event stream
-- KEYS[8] cancels    running attempts with a cancel request
-- KEYS[9] stats      counters for metrics (refusals, expiries, decisions)
-- ARGV[1] n          attempt number
-- ARGV[2] actor      who expires (sweeper id)
-- ARGV[3] force      '1' to expire a live lease (recovery), else '0'
-- ARGV[4] reason     why, recorded in the event
-- Returns: {'OK', new_fence, old_fence} | {'NOOP', why}
-- Events: lease_expired
-- Idempotent: yes (re-checks; a second run is a NOOP)
--@include common

local k_meta, k_counts, k_leases, k_suspect = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local k_task, k_att, k_ev, k_cancels = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local k_stats = KEYS[9]
local n, actor, force, reason = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local t = redis.call('HMGET', k_task, 'id', 'attempts', 'fence', 'queue')
if not t[1] then return {'NOOP', 'no such task'} end
local aid = t[1] .. '/' .. n
local a = redis.call('HMGET', k_att, n .. '.state', n .. '.lease_exp', n .. '.worker', n .. '.fence')
if a[1] ~= 'running' or t[2] ~= n then
  -- A stale index entry (the attempt already settled): drop it.
  redis.call('ZREM', k_leases, aid)
  return {'NOOP', 'attempt is ' .. tostring(a[1])}
end
local ts = now_ms()
if force ~= '1' and ts < tonumber(a[2]) then
  return {'NOOP', 'lease is live for ' .. fmt(tonumber(a[2]) - ts) .. ' ms'}
end
local fence = next_fence(k_meta, t[3])
redis.call('HSET', k_task, 'fence', fmt(fence), 'updated_at', ts)
aset(k_att, n, {'state', 'suspect', 'suspect_at', ts})
redis.call('ZREM', k_leases, aid)
redis.call('ZREM', k_cancels, aid)
redis.call('ZADD', k_suspect, ts, aid)
redis.call('HINCRBY', k_stats, force == '1' and 'lease_voided' or 'lease_expired', 1)
emit(k_ev, 'lease_expired', {'attempt', n, 'actor', actor, 'worker', a[3], 'fence', a[4],
  'new_fence', fmt(fence), 'lease_exp', a[2], 'overdue_ms', fmt(ts - tonumber(a[2])), 'reason', reason})
return {'OK', fmt(fence), a[4]}
