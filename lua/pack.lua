-- mc_queue: pack
-- Pack a finished task's history into one compressed document. The sweeper read the task hash, its
-- Attempts, events and effects and compressed them (zlib JSON, mc_queue.contracts.packing); this script swaps
-- the document in only if nothing was recorded since that read (the same state and updated_at, the
-- same last event, the same number of Attempt fields and effects), so nothing written in between is
-- lost: it answers E_CHANGED and the sweeper reads again. After it the task is one small hash: the
-- fields the scripts read, its fence counter (field 'fence', where it is counted), and the
-- document in chunks of at most 64 bytes (fields z0, z1, ...: Redis keeps a hash of short values as
-- one compact listpack), and the ids of the tasks that wait for it, if any ('dependents', 'released_at'). Its Attempts hash, event stream and effects hash are gone. Every other
-- script refuses a write to it as before; the refusal's event goes to the namespace log rather than
-- growing a stream back. Only a succeeded or canceled task is packed: nothing moves it again.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] task       task hash
-- KEYS[5] attempts   attempts hash
-- KEYS[6] events     task event stream
-- KEYS[7] effects    the task's effects
-- KEYS[8] fence      the task's fence counter (its value moves into the task hash)
-- KEYS[9] topack     finished tasks whose history the sweeper packs
-- ARGV[1] blob        the packed document (binary, 'mcz1' and zlib data, at most 4 MB: larger stays unpacked)
-- ARGV[2] updated_at  the task's updated_at the document holds
-- ARGV[3] last_event  id of the last event the document holds
-- ARGV[4] fields      number of fields of the Attempts hash the document holds
-- ARGV[5] effects     number of effects the document holds
-- ARGV[6] epoch
-- ARGV[7] actor
-- Returns: {'OK', bytes} | {'NOOP', why} (not finished, already packed, no such task: left out of topack)
--          {'E_CHANGED', why} (something was recorded since the read: read again)
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events: none (the document holds the history; the task keeps its state)
-- Idempotent: yes (a packed task is reported, not packed again)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], task = KEYS[4], attempts = KEYS[5],
  events = KEYS[6], effects = KEYS[7], fence = KEYS[8], topack = KEYS[9]}
bind_task(K)
local A, bad = args(ARGV, {
  'blob', 'raw', PACK_MAX_BYTES, false,
  'updated_at', 'int', 0, MAX_INT,
  'last_event', 'text', 64, false,
  'fields', 'int', 0, MAX_INT,
  'effects', 'int', 0, MAX_INT,
  'epoch', 'epoch', false, false,
  'actor', 'id', 200, false,
})
if bad then return bad end
if string.sub(A.blob, 1, 4) ~= 'mcz1' or #A.blob < 12 then
  return {'E_BADARG', "blob must be a packed document ('mcz1' and zlib data)"}
end
if not string.find(A.last_event, '^%d+%-%d+$') then return {'E_BADARG', "last_event must be a stream id '<ms>-<seq>'"} end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end
local t = redis.call('HMGET', K.task, 'id', 'queue', 'handler', 'state', 'payload_digest', 'attempts', 'created_at',
  'updated_at', 'packed', 'idem_key', 'dependents', 'released_at')
if not t[1] then
  redis.call('ZREM', K.topack, string.match(K.task, ':t:(.+)$'))
  return {'NOOP', 'no such task'}
end
if t[9] then
  redis.call('ZREM', K.topack, t[1])
  return {'NOOP', 'already packed'}
end
if t[4] ~= 'succeeded' and t[4] ~= 'canceled' then
  redis.call('ZREM', K.topack, t[1])
  return {'NOOP', 'task is ' .. tostring(t[4]) .. ', not finished'}
end
local last_id = last_event_id(K.events)
if t[8] ~= A.raw.updated_at or last_id ~= A.last_event or redis.call('HLEN', K.attempts) ~= A.fields
   or redis.call('HLEN', K.effects) ~= A.effects then
  return {'E_CHANGED', 'the task changed since it was read (last event ' .. last_id .. ')'}
end
local fence = fence_of(K.task, K.fence)
-- The hash is written anew (Redis never turns a hash table back into a listpack): the same state and
-- the fields the scripts read, then the fence and the document's chunks.
redis.call('DEL', K.task, K.attempts, K.events, K.effects, K.fence)
redis.call('HSET', K.task, 'id', t[1], 'queue', t[2], 'handler', t[3], 'state', t[4],
  'attempts', t[6], 'active', '', 'created_at', t[7], 'updated_at', t[8])
if t[5] then redis.call('HSET', K.task, 'payload_digest', t[5]) end  -- (none: a short payload, in the document)
if t[10] and t[10] ~= '' then redis.call('HSET', K.task, 'idem_key', t[10]) end
-- The tasks waiting for it, and whether the sweeper released them (release.lua and retire read both).
if t[11] then redis.call('HSET', K.task, 'dependents', t[11]) end
if t[12] then redis.call('HSET', K.task, 'released_at', t[12]) end
-- Chunks of 64 bytes while the hash can stay a listpack (at most 128 fields); a larger document is
-- kept whole in one field (the hash is a hash table then, whatever the chunks).
local size = (#A.blob <= PACK_CHUNK * PACK_LISTPACK_CHUNKS) and PACK_CHUNK or #A.blob
local chunks = math.ceil(#A.blob / size)
redis.call('HSET', K.task, 'fence', fence, 'packed', chunks)
for i = 0, chunks - 1 do
  redis.call('HSET', K.task, 'z' .. i, string.sub(A.blob, i * size + 1, (i + 1) * size))
end
redis.call('ZREM', K.topack, t[1])
return {'OK', #A.blob}
