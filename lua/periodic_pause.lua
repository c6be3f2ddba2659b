-- mc_queue: periodic_pause
-- An operator pauses or resumes a periodic schedule. While it is paused its ticks are skipped as they
-- come due (counted in skipped_paused by periodic_decide), never made later. Each change is recorded in
-- the namespace log with who and why; pausing a paused schedule (or resuming a running one) changes
-- nothing.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] periodic   schedule name -> definition JSON (the schedule must be published)
-- KEYS[5] state      the schedule's state hash
-- ARGV[1] name       the schedule's name
-- ARGV[2] action     'pause' | 'resume'
-- ARGV[3] actor
-- ARGV[4] reason     why (>= 10 characters), recorded
-- ARGV[5] epoch
-- Returns: {'OK', action, at_ms} | {'NOOP', why} (already paused, or not paused)
--          {'E_STATE', why} (no such schedule)
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events (nslog): periodic_paused | periodic_resumed | periodic_refused
-- Idempotent: yes (a second run finds the schedule already so)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], periodic = KEYS[4], state = KEYS[5]}
local A, bad = args(ARGV, {
  'name', 'name', false, false,
  'action', 'enum', '|pause|resume|', false,
  'actor', 'id', 200, false,
  'reason', 'text', 2000, false,
  'epoch', 'epoch', false, false,
})
if bad then return bad end
local count, reason = chars(A.reason)
if count < 10 then return {'E_BADARG', 'reason: a pause or resume needs a reason of at least ten characters'} end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end
if redis.call('HEXISTS', K.periodic, A.name) == 0 then
  local why = 'no periodic schedule named ' .. A.name .. ' is published'
  return refuse(K.nslog, nil, 'periodic_refused', {'E_STATE', why},
    {'schedule', A.name, 'action', A.action, 'actor', A.actor, 'reason', why})
end

local current = redis.call('HGET', K.state, 'paused')
local ts = now_ms()
if A.action == 'pause' then
  if current then return {'NOOP', 'schedule ' .. A.name .. ' is already paused'} end
  redis.call('HSET', K.state, 'paused', cjson.encode({reason = reason, actor = A.actor, at = ts}))
  emit(K.nslog, 'periodic_paused', {'schedule', A.name, 'actor', A.actor, 'reason', reason})
else
  if not current then return {'NOOP', 'schedule ' .. A.name .. ' is not paused'} end
  redis.call('HDEL', K.state, 'paused')
  emit(K.nslog, 'periodic_resumed', {'schedule', A.name, 'actor', A.actor, 'reason', reason})
end
return {'OK', A.action, ts}
