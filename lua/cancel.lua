-- mc_queue: cancel
-- Step one of the cancellation protocol: prevent new work. A task with no running Attempt is
-- canceled at once (its pending Attempt too). With a running Attempt the request is recorded and
-- signalled (the next heartbeat tells the executor; new effects and completion are refused); the
-- executor acknowledges (cancel_ack) or its lease is voided after the timeout, then reconciliation
-- settles the Attempt as canceled with the evidence of its effects.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] counts     "<queue>|<state>" counters
-- KEYS[5] task       task hash
-- KEYS[6] attempts   attempts hash
-- KEYS[7] events     task event stream
-- KEYS[8] pending    the queue's pending index
-- KEYS[9] cancels    running attempts with a cancel request (attempt id -> deadline ms)
-- KEYS[10] stats     counters for metrics (refusals, expiries, decisions)
-- KEYS[11] attention attention items (a blocked task's item is resolved by its cancellation)
-- KEYS[12] done      the queue's finished tasks (succeeded, canceled) -> when (ms)
-- KEYS[13] held      the queue's tasks waiting for a person (failed, blocked, quarantined)
-- KEYS[14] released  tasks that ended with dependents waiting (the sweeper's release.lua)
-- KEYS[15] slotwait  Attempts waiting for a concurrency slot (a canceled one leaves the line)
-- ARGV[1] reason     why (recorded; at least ten characters)
-- ARGV[2] actor
-- ARGV[3] timeout_ms how long the executor has to acknowledge
-- ARGV[4] epoch
-- Returns: {'OK', 'canceled'} | {'OK', 'signaled', n, deadline} | {'DUP', state}
--          {'E_STATE', task_state} (already final) | {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_NONS', why} | {'E_BADARG', why}
--          {'E_EPOCH', current}
-- Events: cancel_requested | task_canceled | cancel_refused
-- Idempotent: yes (a second request reports the first)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], counts = KEYS[4], task = KEYS[5],
  attempts = KEYS[6], events = KEYS[7], pending = KEYS[8], cancels = KEYS[9],
  stats = KEYS[10], attention = KEYS[11], done = KEYS[12], held = KEYS[13], released = KEYS[14],
  slotwait = KEYS[15]}
bind_task(K)
local A, bad = args(ARGV, {
  'reason', 'text', 2000, false,
  'actor', 'id', 200, false,
  'timeout_ms', 'int', 0, DAY_MS,
  'epoch', 'epoch', false, false,
})
if bad then return bad end
local count, reason = chars(A.reason)
if count < 10 then return {'E_BADARG', 'reason: a cancellation needs a reason of at least ten characters'} end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end
local t = redis.call('HMGET', K.task, 'id', 'queue', 'state', 'attempts', 'active', 'cancel_requested')
if not t[1] then return {'E_NOTASK', 'no such task'} end
local task_id, queue, state, n = t[1], t[2], t[3], t[4]
if state == 'canceled' then return {'DUP', 'canceled'} end
if state == 'succeeded' or state == 'quarantined' then
  return refuse(K.events, K.stats, 'cancel_refused', {'E_STATE', state},
    {'actor', A.actor, 'reason', 'task is ' .. state .. ' already'})
end
if t[6] then return {'DUP', 'signaled'} end
local ts = now_ms()
local astate = aget(K.attempts, n, 'state')
redis.call('HSET', K.task, 'cancel_requested', reason, 'cancel_at', ts, 'cancel_by', A.actor, 'updated_at', ts)
emit(K.events, 'cancel_requested', {'attempt', n, 'actor', A.actor, 'reason', reason, 'attempt_state', astate or ''})
if astate == 'running' or astate == 'suspect' or astate == 'reconciling' then
  local deadline = ts + A.timeout_ms
  if astate == 'running' then redis.call('ZADD', K.cancels, deadline, task_id .. '/' .. n) end
  return {'OK', 'signaled', tonumber(n), deadline}
end
if astate == 'pending' then
  aset(K.attempts, n, {'state', 'canceled', 'ended_at', ts, 'settled_by', 'cancel'})
  local parked = aget(K.attempts, n, 'parked')
  if parked then redis.call('ZREM', K.slotwait, parked) end
end
redis.call('ZREM', K.pending, task_id)
redis.call('HSET', K.task, 'state', 'canceled', 'active', '')
redis.call('HDEL', K.attention, task_id)
move_count(K.counts, queue, state, 'canceled', K.task)
index_end(K, task_id, state, 'canceled', ts)
emit(K.events, 'task_canceled', {'attempt', n, 'actor', A.actor, 'reason', reason})
return {'OK', 'canceled'}
