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
-- KEYS[9] dlq        quarantined tasks
-- KEYS[10] attention attention items
-- KEYS[11] stats     counters for metrics (refusals, expiries, decisions)
-- KEYS[12] done      the queue's finished tasks (succeeded, canceled) -> when (ms)
-- KEYS[13] held      the queue's tasks waiting for a person (failed, blocked, quarantined)
-- KEYS[14] released  tasks that ended with dependents waiting (index_end; a retry or replay ends nothing)
-- ARGV[1] reason      why it may run again (>= 10 characters)
-- ARGV[2] hypothesis  what is different now
-- ARGV[3] actor
-- ARGV[4] request_id  a resend with the same id returns the Attempt it created
-- ARGV[5] epoch
-- Returns: {'OK', n, attempt_fields} | {'DUP', n, attempt_fields} | {'E_STATE', task_state}
--          {'E_BADARG', why} | {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current}
-- Events: dlq_replayed | attempt_created | replay_refused
-- Idempotent: by request id
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], counts = KEYS[4], task = KEYS[5],
  attempts = KEYS[6], events = KEYS[7], pending = KEYS[8], dlq = KEYS[9],
  attention = KEYS[10], stats = KEYS[11], done = KEYS[12], held = KEYS[13], released = KEYS[14]}
bind_task(K)
local A, bad = args(ARGV, {
  'reason', 'text', 2000, false,
  'hypothesis', 'text', 2000, false,
  'actor', 'id', 200, false,
  'request_id', 'reqid', false, false,
  'epoch', 'epoch', false, false,
})
if bad then return bad end
local count, reason = chars(A.reason)
if count < 10 then return {'E_BADARG', 'reason: a replay needs a reason of at least ten characters'} end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end
local t = redis.call('HMGET', K.task, 'id', 'queue', 'state', 'attempts')
if not t[1] then return {'E_NOTASK', 'no such task'} end
if A.request_id ~= '' and aget(K.attempts, t[4], 'create_req') == A.request_id then
  return {'DUP', tonumber(t[4]), attempt_snapshot(K.attempts, K.task, t[4])}
end
if t[3] ~= 'quarantined' then
  return refuse(K.events, K.stats, 'replay_refused', {'E_STATE', t[3]},
    {'actor', A.actor, 'reason', 'only a quarantined task is replayed; this one is ' .. t[3]})
end
local ts = now_ms()
local m = tonumber(t[4]) + 1
aset(K.attempts, m, {'state', 'pending', 'created_at', ts, 'due_at', ts, 'prev', t[4], 'reason', reason,
  'hypothesis', A.hypothesis, 'retry_by', A.actor,
  'create_req', A.request_id})
redis.call('HSET', K.task, 'state', 'pending', 'attempts', m, 'active', m, 'updated_at', ts)
redis.call('ZADD', K.pending, ts, t[1])
redis.call('ZREM', K.dlq, t[1])
redis.call('HDEL', K.attention, t[1])
move_count(K.counts, t[2], 'quarantined', 'pending', K.task)
index_end(K, t[1], 'quarantined', 'pending', ts)
emit(K.events, 'dlq_replayed', {'attempt', m, 'actor', A.actor, 'reason', reason})
emit(K.events, 'attempt_created', {'attempt', m, 'retry_of', t[4], 'actor', A.actor, 'reason', reason,
  'hypothesis', A.hypothesis, 'due_at', ts})
return {'OK', m, attempt_snapshot(K.attempts, K.task, m)}
