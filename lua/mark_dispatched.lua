-- mc_queue: mark_dispatched
-- After an Attempt was handed to the transport (an RQ job), push its outbox entry to the time it
-- should be checked again. A claim removes the entry; if none comes by then, the sweeper sends the
-- same job again (same job id: a duplicate message is refused by the claim, never run twice).
-- KEYS[1] outbox     attempts waiting to be dispatched
-- KEYS[2] attempts   attempts hash of the task
-- ARGV[1] attempt_id
-- ARGV[2] n          attempt number
-- ARGV[3] recheck_ms when to look again if nobody claimed it
-- Returns: {'OK', recheck_at} | {'NOOP', why} (claimed meanwhile, or not pending any more)
-- Idempotent: yes
--@include common

local k_outbox, k_att = KEYS[1], KEYS[2]
local attempt_id, n, recheck = ARGV[1], ARGV[2], tonumber(ARGV[3])
if not redis.call('ZSCORE', k_outbox, attempt_id) then return {'NOOP', 'not in the outbox'} end
local state = aget(k_att, n, 'state')
if state ~= 'pending' then
  redis.call('ZREM', k_outbox, attempt_id)
  return {'NOOP', 'attempt is ' .. tostring(state)}
end
local ts = now_ms()
local due = tonumber(aget(k_att, n, 'due_at') or '0') or 0
local at = math.max(ts, due) + recheck
redis.call('ZADD', k_outbox, at, attempt_id)
redis.call('HINCRBY', k_att, n .. '.dispatches', 1)
aset(k_att, n, {'dispatched_at', ts})
return {'OK', at}
