-- mc_queue: queue_pause
-- An operator pauses or resumes a queue. While a queue is paused, claim refuses its Attempts
-- (E_CLAIM 'queue <q> is paused': a worker ends the message quietly, the task stays pending) and the
-- sweeper does not dispatch them. No task changes state. Each change is recorded in the namespace
-- log with who and why; pausing a paused queue (or resuming a running one) changes nothing.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] paused     paused queues: queue -> {"reason", "actor", "at"} JSON
-- ARGV[1] queue      the queue's name
-- ARGV[2] action     'pause' | 'resume'
-- ARGV[3] actor
-- ARGV[4] reason     why (>= 10 characters), recorded
-- ARGV[5] epoch
-- Returns: {'OK', action, at_ms} | {'NOOP', why} (already paused, or not paused)
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events (nslog): queue_paused | queue_resumed
-- Idempotent: yes (a second run finds the queue already so)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], paused = KEYS[4]}
local A, bad = args(ARGV, {
  'queue', 'id', 64, false,
  'action', 'enum', '|pause|resume|', false,
  'actor', 'id', 200, false,
  'reason', 'text', 2000, false,
  'epoch', 'epoch', false, false,
})
if bad then return bad end
if not string.find(A.queue, '^[%w][%w_%.%-]*$') then
  return {'E_BADARG', "queue must be 1-64 of letters, digits, '_', '.', '-', starting with a letter or digit"}
end
local count, reason = chars(A.reason)
if count < 10 then return {'E_BADARG', 'reason: a pause or resume needs a reason of at least ten characters'} end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end

local current = redis.call('HGET', K.paused, A.queue)
local ts = now_ms()
if A.action == 'pause' then
  if current then return {'NOOP', 'queue ' .. A.queue .. ' is already paused'} end
  redis.call('HSET', K.paused, A.queue, cjson.encode({reason = reason, actor = A.actor, at = ts}))
  emit(K.nslog, 'queue_paused', {'queue', A.queue, 'actor', A.actor, 'reason', reason})
else
  if not current then return {'NOOP', 'queue ' .. A.queue .. ' is not paused'} end
  redis.call('HDEL', K.paused, A.queue)
  emit(K.nslog, 'queue_resumed', {'queue', A.queue, 'actor', A.actor, 'reason', reason})
end
return {'OK', A.action, ts}
