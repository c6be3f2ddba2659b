-- mc_queue: periodic_publish
-- An App publishes one of its periodic schedules (or withdraws one it no longer declares). A schedule
-- seen for the first time starts after now (Redis's clock): its cursor is set to now, so no tick from
-- before it existed runs. A schedule published again keeps its cursor, state, pause and counts; a new
-- definition applies from its next tick.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] periodic   schedule name -> definition JSON
-- KEYS[5] state      the schedule's state hash
-- ARGV[1] name       the schedule's name
-- ARGV[2] spec       its definition (JSON object), or '' to withdraw it
-- ARGV[3] actor
-- ARGV[4] epoch
-- Returns: {'OK', 'published' | 'withdrawn', cursor_ms} | {'NOOP', why} (the same definition again, or
--          withdrawing one that is not published)
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events (nslog): periodic_published | periodic_withdrawn
-- Idempotent: yes (the same definition again is a NOOP)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], periodic = KEYS[4], state = KEYS[5]}
local A, bad = args(ARGV, {
  'name', 'name', false, false,
  'spec', 'json?', 65536, 'obj',
  'actor', 'id', 200, false,
  'epoch', 'epoch', false, false,
})
if bad then return bad end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end

local current = redis.call('HGET', K.periodic, A.name)
if A.spec == '' then
  if not current then return {'NOOP', 'schedule ' .. A.name .. ' is not published'} end
  redis.call('HDEL', K.periodic, A.name)
  emit(K.nslog, 'periodic_withdrawn', {'schedule', A.name, 'actor', A.actor})
  return {'OK', 'withdrawn', redis.call('HGET', K.state, 'cursor') or ''}
end
if current == A.spec then return {'NOOP', 'schedule ' .. A.name .. ' is published with this definition'} end
redis.call('HSET', K.periodic, A.name, A.spec)
redis.call('HSETNX', K.state, 'cursor', fmt(now_ms()))
emit(K.nslog, 'periodic_published', {'schedule', A.name, 'actor', A.actor, 'changed', current and '1' or ''})
return {'OK', 'published', redis.call('HGET', K.state, 'cursor')}
