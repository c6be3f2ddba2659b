-- mc_queue: dlq_purge
-- Delete a quarantined task and its whole history, for good (an operator's explicit act; the
-- namespace log keeps a line saying who purged what and why).
-- KEYS[1] nslog      namespace event stream
-- KEYS[2] counts     "<queue>|<state>" counters
-- KEYS[3] idem       producer idempotency keys
-- KEYS[4] dlq        quarantined tasks
-- KEYS[5] attention  attention items
-- KEYS[6] task       task hash
-- KEYS[7] attempts   attempts hash
-- KEYS[8] events     task event stream
-- KEYS[9] effects    the task's effects
-- ARGV[1] actor
-- ARGV[2] reason
-- Returns: {'OK', attempts} | {'E_STATE', task_state} | {'E_NOTASK', why}
-- Events (nslog): task_purged
-- Idempotent: yes (a purged task is gone: E_NOTASK)
--@include common

local k_nslog, k_counts, k_idem, k_dlq, k_attention = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local k_task, k_att, k_ev, k_effects = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local t = redis.call('HMGET', k_task, 'id', 'queue', 'state', 'attempts', 'idem_key')
if not t[1] then return {'E_NOTASK', 'no such task'} end
if t[3] ~= 'quarantined' then return {'E_STATE', t[3]} end
redis.call('DEL', k_task, k_att, k_ev, k_effects)
redis.call('ZREM', k_dlq, t[1])
redis.call('HDEL', k_attention, t[1])
if t[5] and t[5] ~= '' then redis.call('HDEL', k_idem, t[5]) end
move_count(k_counts, t[2], 'quarantined', '')
emit(k_nslog, 'task_purged', {'task', t[1], 'actor', ARGV[1], 'reason', ARGV[2], 'attempts', t[4]})
return {'OK', tonumber(t[4])}
