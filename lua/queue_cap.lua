-- mc_queue: queue_cap
-- Set or delete a queue's cap (backpressure): at most max_depth tasks that have not ended (pending,
-- scheduled, backoff, running, waiting); enqueue, enqueue_many and enqueue_after refuse beyond it (E_FULL
-- with a retry_after, nothing written: admit.lua queue_room), shedding the lowest priorities first, and
-- refuse a task whose start_by the queue's age already makes impossible. Work already admitted goes on. An
-- App's cap ('app') does not replace one an operator set ('operator'). Recorded in the namespace log.
-- A fairness key's cap ('@<key>', or '@<name>:*' for each key of a family): at most max_depth tasks naming the
-- key (fair_key) that have not ended, in all queues (the counters "@<key>|open": common.lua move_count).
-- By bytes ('set_bytes', 'delete_bytes'; field "<queue>|bytes" or "@<key>|bytes"): at most max_depth bytes of
-- payload in the tasks not ended (the counters of the same names).
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] caps       queue (or '@<key>') -> "<max depth> <source>"; "<queue>|bytes" -> "<max bytes> <source>"
-- ARGV[1] epoch
-- ARGV[2] actor
-- ARGV[3] op         'set' | 'delete' | 'set_bytes' | 'delete_bytes'
-- ARGV[4] queue      the queue's name, or '@<fairness key>' (a key, or a family '@<name>:*')
-- ARGV[5] max_depth  tasks not ended the queue may hold (set: 1..100000000), or bytes of their payloads
--                    (set_bytes: 1..1000000000000), else ''
-- ARGV[6] source     'operator' | 'app'
-- ARGV[7] reason     why, recorded
-- Returns: {'OK', op, at_ms} | {'NOOP', why}
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events (nslog): queue_cap_set | queue_cap_deleted (a cap by bytes: with 'bytes' 1)
-- Idempotent: yes (a second run finds the cap already so)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], caps = KEYS[4]}
local A, bad = args(ARGV, {
  'epoch', 'epoch', false, false,
  'actor', 'id', 200, false,
  'op', 'enum', '|set|delete|set_bytes|delete_bytes|', false,
  'queue', 'id', 131, false,
  'max_depth', 'int?', 1, 1000000000000,
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
local bytes = A.op == 'set_bytes' or A.op == 'delete_bytes'
local setting = A.op == 'set' or A.op == 'set_bytes'
if setting ~= (A.max_depth ~= nil) then return {'E_BADARG', 'max_depth is for set and set_bytes, and each needs it'} end
if A.op == 'set' and A.max_depth > 100000000 then return {'E_BADARG', 'max_depth must be between 1 and 100000000'} end
if A.reason == '' then return {'E_BADARG', 'reason: say why (it is recorded)'} end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end

local ts = now_ms()
local field = bytes and (A.queue .. '|bytes') or A.queue
local what = bytes and ('bytes of ' .. A.queue) or A.queue
local current = redis.call('HGET', K.caps, field)
local ev = {'queue', A.queue, 'actor', A.actor, 'reason', A.reason, 'source', A.source,
  unpack(bytes and {'bytes', '1'} or {})}
if setting then
  local value = A.raw.max_depth .. ' ' .. A.source
  if string.match(current or '', ' (%a+)$') == 'operator' and A.source == 'app' then
    return {'NOOP', 'an operator capped ' .. what .. ' (' .. current .. '): the App does not replace it'}
  end
  if current == value then return {'NOOP', what .. ' is capped at ' .. A.raw.max_depth .. ' already'} end
  redis.call('HSET', K.caps, field, value)
  emit(K.nslog, 'queue_cap_set', {'max_depth', A.raw.max_depth, unpack(ev)})
  return {'OK', A.op, ts}
end
if not current then return {'NOOP', what .. ' has no cap'} end
redis.call('HDEL', K.caps, field)
emit(K.nslog, 'queue_cap_deleted', ev)
return {'OK', A.op, ts}
