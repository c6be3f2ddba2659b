-- mc_queue: queue_forget
-- Forget a queue that holds nothing: no task in any state (its counters are all zero and its pending,
-- done and held indexes empty), no retention policy of the operator's or the App's, not paused. Its
-- name leaves the queue set, its zero counters and the console's samples of it are deleted, so a
-- namespace whose queues come and go does not keep (and sample, and list) every queue it ever had.
-- The next enqueue on it brings the queue back. Re-checks everything itself: a task enqueued since
-- the sweeper looked keeps the queue.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] queues     set of queue names
-- KEYS[5] counts     "<queue>|<state>" counters
-- KEYS[6] retention  retention policies: "<queue>" (operator) and "app:<queue>" (App)
-- KEYS[7] paused     paused queues
-- KEYS[8] pending    the queue's pending index
-- KEYS[9] done       the queue's finished tasks
-- KEYS[10] held      the queue's tasks waiting for a person
-- KEYS[11] samples   the operator console's samples of the queue
-- ARGV[1] queue      the queue's name
-- ARGV[2] actor
-- ARGV[3] epoch
-- Returns: {'OK'} (forgotten) | {'NOOP', why} (not a known queue, or it still holds something)
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events (nslog): queue_forgotten
-- Idempotent: yes (a forgotten queue is not a known queue: NOOP)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], queues = KEYS[4], counts = KEYS[5],
  retention = KEYS[6], paused = KEYS[7], pending = KEYS[8], done = KEYS[9], held = KEYS[10], samples = KEYS[11]}
local A, bad = args(ARGV, {
  'queue', 'id', 64, false,
  'actor', 'id', 200, false,
  'epoch', 'epoch', false, false,
})
if bad then return bad end
if not string.find(A.queue, '^[%w][%w_%.%-]*$') then
  return {'E_BADARG', 'queue must be letters, digits, _ . - (starting with a letter or digit)'}
end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end
if redis.call('SISMEMBER', K.queues, A.queue) == 0 then return {'NOOP', 'not a known queue'} end
local fields = {}
for _, s in ipairs(TASK_STATES) do fields[#fields + 1] = A.queue .. '|' .. s end
for i, v in ipairs(redis.call('HMGET', K.counts, unpack(fields))) do
  if v and v ~= '0' then return {'NOOP', 'the queue holds ' .. v .. ' ' .. TASK_STATES[i] .. ' task(s)'} end
end
if redis.call('ZCARD', K.pending) + redis.call('ZCARD', K.done) + redis.call('ZCARD', K.held) > 0 then
  return {'NOOP', 'the queue still has index entries'}
end
if redis.call('HEXISTS', K.retention, A.queue) == 1 or redis.call('HEXISTS', K.retention, 'app:' .. A.queue) == 1 then
  return {'NOOP', 'the queue has a retention policy'}
end
if redis.call('HEXISTS', K.paused, A.queue) == 1 then return {'NOOP', 'the queue is paused'} end
redis.call('SREM', K.queues, A.queue)
redis.call('HDEL', K.counts, unpack(fields))
redis.call('DEL', K.samples)
emit(K.nslog, 'queue_forgotten', {'queue', A.queue, 'actor', A.actor, 'reason', 'no task, no retention policy'})
return {'OK'}
