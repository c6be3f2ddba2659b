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
-- KEYS[9] outbox     attempts waiting to be dispatched to the transport
-- KEYS[10] cancels   running attempts with a cancel request (attempt id -> deadline ms)
-- ARGV[1] reason     why (recorded)
-- ARGV[2] actor
-- ARGV[3] timeout_ms how long the executor has to acknowledge
-- ARGV[4] epoch
-- Returns: {'OK', 'canceled'} | {'OK', 'signaled', n, deadline} | {'DUP', state}
--          {'E_STATE', task_state} (already final) | {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_BADARG', why}
--          {'E_EPOCH', current}
-- Events: cancel_requested | task_canceled | cancel_refused
-- Idempotent: yes (a second request reports the first)
--@include common

local k_meta, k_epochs, k_nslog, k_counts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local k_task, k_att, k_ev, k_pending, k_outbox, k_cancels = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local reason, actor, timeout_ms, epoch = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]

if not timeout_ms or timeout_ms < 0 then return {'E_BADARG', 'timeout_ms must be >= 0'} end
if select(2, string.gsub(reason, '[^\128-\191]', '')) < 10 then
  return {'E_BADARG', 'a cancellation needs a reason of at least ten characters'}
end
local err = ns_check(k_meta, k_epochs, k_nslog, epoch, '0', actor, false)
if err then return err end
local t = redis.call('HMGET', k_task, 'id', 'queue', 'state', 'attempts', 'active', 'cancel_requested')
if not t[1] then return {'E_NOTASK', 'no such task'} end
local task_id, queue, state, n = t[1], t[2], t[3], t[4]
if state == 'canceled' then return {'DUP', 'canceled'} end
if state == 'succeeded' or state == 'quarantined' then
  emit(k_ev, 'cancel_refused', {'actor', actor, 'reason', 'task is ' .. state .. ' already'})
  return {'E_STATE', state}
end
local ts = now_ms()
local astate = aget(k_att, n, 'state')
if t[6] then return {'DUP', 'signaled'} end
redis.call('HSET', k_task, 'cancel_requested', reason, 'cancel_at', ts, 'cancel_by', actor, 'updated_at', ts)
emit(k_ev, 'cancel_requested', {'attempt', n, 'actor', actor, 'reason', reason, 'attempt_state', astate or ''})
if astate == 'running' or astate == 'suspect' or astate == 'reconciling' then
  local deadline = ts + timeout_ms
  if astate == 'running' then redis.call('ZADD', k_cancels, deadline, task_id .. '/' .. n) end
  return {'OK', 'signaled', tonumber(n), deadline}
end
if astate == 'pending' then
  aset(k_att, n, {'state', 'canceled', 'ended_at', ts, 'settled_by', 'cancel'})
end
redis.call('ZREM', k_pending, task_id)
redis.call('ZREM', k_outbox, task_id .. '/' .. n)
redis.call('HSET', k_task, 'state', 'canceled', 'active', '')
move_count(k_counts, queue, state, 'canceled')
emit(k_ev, 'task_canceled', {'attempt', n, 'actor', actor, 'reason', reason})
return {'OK', 'canceled'}
