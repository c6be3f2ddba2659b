-- mc_queue: dlq_replay
-- A person takes a quarantined task out of the dead-letter queue: a new Attempt N+1 with the
-- recorded reason (and hypothesis), never a blind repeat. The only way a quarantined task runs again.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] counts     "<queue>|<state>" counters
-- KEYS[5] task       task hash
-- KEYS[6] attempts   attempts hash
-- KEYS[7] events     task event stream
-- KEYS[8] pending    the queue's pending index
-- KEYS[9] outbox     attempts waiting to be dispatched to the transport
-- KEYS[10] dlq       quarantined tasks
-- KEYS[11] attention attention items
-- ARGV[1] reason      why it may run again (>= 10 characters)
-- ARGV[2] hypothesis  what is different now
-- ARGV[3] actor
-- ARGV[4] epoch
-- Returns: {'OK', n, attempt_fields} | {'E_STATE', task_state} | {'E_BADARG', why} | {'E_NOTASK', why}
--          {'E_NSLOST', why} | {'E_EPOCH', current}
-- Events: dlq_replayed | attempt_created
-- Idempotent: no; a second replay is refused because the task is no longer quarantined
--@include common

local k_meta, k_epochs, k_nslog, k_counts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local k_task, k_att, k_ev, k_pending = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local k_outbox, k_dlq, k_attention = KEYS[9], KEYS[10], KEYS[11]
local reason, hypothesis, actor, epoch = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

if select(2, string.gsub(reason, '[^\128-\191]', '')) < 10 then
  return {'E_BADARG', 'a replay needs a reason of at least ten characters'}
end
local err = ns_check(k_meta, k_epochs, k_nslog, epoch, '0', actor, false)
if err then return err end
local t = redis.call('HMGET', k_task, 'id', 'queue', 'state', 'attempts', 'manifest')
if not t[1] then return {'E_NOTASK', 'no such task'} end
if t[3] ~= 'quarantined' then return {'E_STATE', t[3]} end
local ts = now_ms()
local m = tonumber(t[4]) + 1
aset(k_att, m, {'state', 'pending', 'created_at', ts, 'due_at', ts, 'prev', t[4], 'reason', reason,
  'hypothesis', hypothesis, 'manifest', t[5], 'worktree', t[1] .. '/' .. m, 'retry_by', actor})
redis.call('HSET', k_task, 'state', 'pending', 'attempts', m, 'active', m, 'updated_at', ts)
redis.call('ZADD', k_pending, ts, t[1])
redis.call('ZADD', k_outbox, ts, t[1] .. '/' .. m)
redis.call('ZREM', k_dlq, t[1])
redis.call('HDEL', k_attention, t[1])
move_count(k_counts, t[2], 'quarantined', 'pending')
emit(k_ev, 'dlq_replayed', {'attempt', m, 'actor', actor, 'reason', reason})
emit(k_ev, 'attempt_created', {'attempt', m, 'retry_of', t[4], 'actor', actor, 'reason', reason,
  'hypothesis', hypothesis, 'due_at', ts})
return {'OK', m, attempt_snapshot(k_att, m)}
