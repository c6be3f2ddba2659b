-- mc_queue: retry
-- Append Attempt N+1 with its recorded reason and hypothesis. Mission Control's rules: only with
-- no active Attempt, the latest one failed, and a reason of at least ten characters; succeeded,
-- canceled and quarantined tasks never run again. A delay makes the task wait in backoff.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] counts     "<queue>|<state>" counters
-- KEYS[5] task       task hash
-- KEYS[6] attempts   attempts hash
-- KEYS[7] events     task event stream
-- KEYS[8] pending    the queue's pending index
-- KEYS[9] attention  attention items (resolved by this decision)
-- KEYS[10] stats     counters for metrics (refusals, expiries, decisions)
-- KEYS[11] done      the queue's finished tasks (succeeded, canceled) -> when (ms)
-- KEYS[12] held      the queue's tasks waiting for a person (failed, blocked, quarantined)
-- KEYS[13] released  tasks that ended with dependents waiting (index_end; a retry or replay ends nothing)
-- ARGV[1] reason      why another Attempt (>= 10 characters)
-- ARGV[2] hypothesis  what is different this time, or ''
-- ARGV[3] actor       who decides (operator, policy)
-- ARGV[4] request_id  a resend with the same id returns the same Attempt
-- ARGV[5] delay_ms    wait before the new Attempt may be claimed
-- ARGV[6] epoch
-- Returns: {'OK', n, due_at, attempt_fields} | {'DUP', n, due_at, attempt_fields}
--          {'E_RETRY', why} | {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events: attempt_created (retry_of, reason, hypothesis) | retry_refused
-- Idempotent: by request id
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], counts = KEYS[4], task = KEYS[5],
  attempts = KEYS[6], events = KEYS[7], pending = KEYS[8], attention = KEYS[9],
  stats = KEYS[10], done = KEYS[11], held = KEYS[12], released = KEYS[13]}
bind_task(K)
local A, bad = args(ARGV, {
  'reason', 'text', 2000, false,
  'hypothesis', 'text', 2000, false,
  'actor', 'id', 200, false,
  'request_id', 'reqid', false, false,
  'delay_ms', 'int', 0, 365 * DAY_MS,
  'epoch', 'epoch', false, false,
})
if bad then return bad end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end
local t = redis.call('HMGET', K.task, 'id', 'queue', 'state', 'attempts', 'active')
if not t[1] then return {'E_NOTASK', 'no such task'} end
local task_id, queue, state, n = t[1], t[2], t[3], tonumber(t[4])
local latest = redis.call('HMGET', K.attempts, n .. '.state', n .. '.create_req', n .. '.due_at')
if A.request_id ~= '' and latest[2] == A.request_id then return {'DUP', n, latest[3], attempt_snapshot(K.attempts, K.task, n)} end

local why = nil
local count, reason = chars(A.reason)
if state == 'succeeded' or state == 'canceled' or state == 'quarantined' then
  why = 'task is ' .. state .. ' and never runs again'
elseif t[5] ~= '' then
  why = 'attempt ' .. t[5] .. ' is still ' .. tostring(latest[1])
elseif latest[1] ~= 'failed' then
  why = 'the latest attempt (' .. n .. ') is ' .. tostring(latest[1]) .. ', not failed'
elseif count < 10 then
  why = 'a retry needs a recorded reason of at least ten characters'
end
if why then
  return refuse(K.events, K.stats, 'retry_refused', {'E_RETRY', why}, {'attempt', n, 'actor', A.actor, 'reason', why})
end

local ts = now_ms()
local m = n + 1
local due = ts + A.delay_ms
local new_state = (A.delay_ms > 0) and 'backoff' or 'pending'
aset(K.attempts, m, {'state', 'pending', 'created_at', ts, 'due_at', due, 'prev', n, 'reason', reason,
  'hypothesis', A.hypothesis, 'create_req', A.request_id,
  'retry_by', A.actor})
redis.call('HSET', K.task, 'state', new_state, 'attempts', m, 'active', m, 'updated_at', ts)
redis.call('ZADD', K.pending, due, task_id)
redis.call('HDEL', K.attention, task_id)
move_count(K.counts, queue, state, new_state, K.task)
index_end(K, task_id, state, new_state, ts)
emit(K.events, 'attempt_created', {'attempt', m, 'retry_of', n, 'actor', A.actor, 'reason', reason,
  'hypothesis', A.hypothesis, 'due_at', due})
return {'OK', m, due, attempt_snapshot(K.attempts, K.task, m)}
