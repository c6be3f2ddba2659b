-- mc_queue: queue_cap
-- Set or delete a queue's cap (backpressure): at most max_depth tasks that have not ended (pending,
-- scheduled, backoff, running, waiting); enqueue, enqueue_many and enqueue_after refuse beyond it (E_FULL
-- with a retry_after, nothing written: admit.lua queue_room), shedding the lowest priorities first, and
-- refuse a task whose start_by the queue's age already makes impossible. Work already admitted goes on. An
-- App's cap ('app') does not replace one an operator set ('operator'). Recorded in the namespace log.
-- A fairness key's cap ('@<key>', or '@<name>:*' for each key of a family): at most max_depth tasks naming the
-- key (fair_key) that have not ended, in all queues (the counters "@<key>|open": common.lua move_count).
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] caps       queue (or '@<key>') -> "<max depth> <source>"
-- ARGV[1] epoch
-- ARGV[2] actor
-- ARGV[3] op         'set' | 'delete'
-- ARGV[4] queue      the queue's name, or '@<fairness key>' (a key, or a family '@<name>:*')
-- ARGV[5] max_depth  tasks not ended the queue may hold (set: 1..100000000), else ''
-- ARGV[6] source     'operator' | 'app'
-- ARGV[7] reason     why, recorded
-- Returns: {'OK', op, at_ms} | {'NOOP', why}
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events (nslog): queue_cap_set | queue_cap_deleted
-- Idempotent: yes (a second run finds the cap already so)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], caps = KEYS[4]}
local A, bad = args(ARGV, {
  'epoch', 'epoch', false, false,
  'actor', 'id', 200, false,
  'op', 'enum', '|set|delete|', false,
  'queue', 'id', 131, false,
  'max_depth', 'int?', 1, 100000000,
  'source', 'enum', '|operator|app|', false,
  'reason', 'text', 2000, false,
})
if bad then return bad end
local fkey = string.match(A.queue, '^@(.+)$')
if fkey then
  local base = string.match(fkey, '^(.+:)%*$') or fkey
  if #base > 128 or not string.find(base, '^[%w][%w_%.:%-]*$') then
    return {'E_BADARG', "a key's cap is '@<key>': 1-128 of letters, digits, '_', '.', ':', '-', starting with a " ..
      "letter or digit (or '@<name>:*', a family)"}
  end
elseif #A.queue > 64 or not string.find(A.queue, '^[%w][%w_%.%-]*$') then
  return {'E_BADARG', "queue must be 1-64 of letters, digits, '_', '.', '-', starting with a letter or digit"}
end
if (A.op == 'set') ~= (A.max_depth ~= nil) then return {'E_BADARG', 'max_depth is for set, and set needs it'} end
if A.reason == '' then return {'E_BADARG', 'reason: say why (it is recorded)'} end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end

local ts = now_ms()
local current = redis.call('HGET', K.caps, A.queue)
local ev = {'queue', A.queue, 'actor', A.actor, 'reason', A.reason, 'source', A.source}
if A.op == 'set' then
  local value = A.raw.max_depth .. ' ' .. A.source
  if string.match(current or '', ' (%a+)$') == 'operator' and A.source == 'app' then
    return {'NOOP', 'an operator capped queue ' .. A.queue .. ' (' .. current .. '): the App does not replace it'}
  end
  if current == value then return {'NOOP', 'queue ' .. A.queue .. ' is capped at ' .. A.raw.max_depth .. ' already'} end
  redis.call('HSET', K.caps, A.queue, value)
  emit(K.nslog, 'queue_cap_set', {'max_depth', A.raw.max_depth, unpack(ev)})
  return {'OK', 'set', ts}
end
if not current then return {'NOOP', 'queue ' .. A.queue .. ' has no cap'} end
redis.call('HDEL', K.caps, A.queue)
emit(K.nslog, 'queue_cap_deleted', ev)
return {'OK', 'delete', ts}
