-- mc_queue: slot_wake
-- A concurrency slot returned (slots_free put the key's first waiter in the wake set) or the audit found one
-- free (slot_audit.lua): make that waiter's parked Attempt due now, so the sweeper sends it and its claim
-- takes the slot. A waiter that is no longer parked there (claimed, canceled, gone, parked on another key)
-- passes the wake on to the key's next waiter, so no returned slot waits on a task that left the line.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] slotwait   Attempts waiting for a slot ("<key>\n<place>\n<queue>\n<task id>", score 0)
-- KEYS[5] slotwake   waiters to wake (the same members, scored by when their slot returned)
-- KEYS[6] task       the waiter's task hash
-- KEYS[7] attempts   its attempts hash
-- KEYS[8] events     its event stream
-- KEYS[9] pending    its queue's pending index
-- ARGV[1] key        the wake set's member ("<key>\n<place>\n<queue>\n<task id>"), in its four parts
-- ARGV[2] place
-- ARGV[3] queue
-- ARGV[4] task_id
-- ARGV[5] actor      who wakes (sweeper id)
-- ARGV[6] epoch
-- Returns: {'OK', attempt id} | {'NOOP', why, passed to} (passed to: the next waiter's member, or '')
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events: slot_free (the task's)
-- Idempotent: yes (a second run finds the member gone from the wake set: NOOP)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], slotwait = KEYS[4], slotwake = KEYS[5],
  task = KEYS[6], attempts = KEYS[7], events = KEYS[8], pending = KEYS[9]}
bind_task(K)
local A, bad = args(ARGV, {
  'key', 'lkey', false, false,
  'place', 'int', 0, MAX_INT,
  'queue', 'id', 200, false,
  'task_id', 'id', 200, false,
  'actor', 'text', 200, false,
  'epoch', 'epoch', false, false,
})
if bad then return bad end
local key, queue, task_id = A.key, A.queue, A.task_id
if string.sub(K.pending, -(#queue + 9)) ~= ':' .. queue .. ':pending' then
  return {'E_BADARG', 'pending is not the pending index of queue ' .. queue}
end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end
local t = redis.call('HMGET', K.task, 'id', 'attempts', 'queue')
if t[1] and t[1] ~= task_id then return {'E_BADARG', 'member names another task than the keys'} end
local member = key .. '\n' .. slot_pad(A.place) .. '\n' .. queue .. '\n' .. task_id
if not redis.call('ZSCORE', K.slotwake, member) then return {'NOOP', 'not in the wake set', ''} end
redis.call('ZREM', K.slotwake, member)
local n = t[2] or '0'
local a = t[1] and redis.call('HMGET', K.attempts, n .. '.state', n .. '.parked') or {}
if not t[1] or t[3] ~= queue or a[1] ~= 'pending' or a[2] ~= member then
  -- (left the line: the next waiter of the key has the wake)
  local why = not t[1] and 'no such task' or ('attempt ' .. n .. ' is ' .. tostring(a[1]) .. ', not waiting there')
  local lo, hi = '[' .. key .. '\n', '(' .. key .. '\11'
  local w = redis.call('ZRANGEBYLEX', K.slotwait, lo, hi, 'LIMIT', 0, 1)[1]
  if w then
    redis.call('ZREM', K.slotwait, w)
    redis.call('ZADD', K.slotwake, 'NX', fmt(now_ms()), w)
  end
  return {'NOOP', why, w or ''}
end
local ts = fmt(now_ms())
aset(K.attempts, n, {'due_at', ts})
redis.call('HDEL', K.attempts, n .. '.dispatched_at')
redis.call('ZADD', K.pending, 'XX', ts, task_id)
emit(K.events, 'slot_free', {'attempt', n, 'key', key, 'actor', A.actor})
return {'OK', task_id .. '/' .. n}
