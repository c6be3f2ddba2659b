-- mc_queue: init
-- Create the namespace meta on first use, or report it. When a witness (a file the embedded server
-- keeps beside its data) remembers an epoch but Redis has no meta, Redis lost its data: the namespace
-- is created in state "lost" so that nothing runs until `mcq recover`.
-- KEYS[1] meta     namespace meta hash
-- KEYS[2] nslog    namespace event stream
-- ARGV[1] epoch    epoch to create when the namespace is new
-- ARGV[2] witness  epoch a witness remembers, or ''
-- ARGV[3] actor    who asks
-- Returns: {'OK', state, epoch, seq, floor}
-- Idempotent: yes (creates only when missing)
--@include common

local k_meta, k_nslog = KEYS[1], KEYS[2]
local epoch, witness, actor = ARGV[1], ARGV[2], ARGV[3]

if redis.call('EXISTS', k_meta) == 0 then
  if witness ~= '' then
    redis.call('HSET', k_meta, 'epoch', witness)
    mark_lost(k_meta, k_nslog, 'namespace meta is missing but the witness remembers epoch ' .. witness ..
      ': Redis lost its data', actor)
  else
    redis.call('HSET', k_meta, 'state', 'ok', 'epoch', epoch, 'seq', 0, 'floor', 0, 'created_at', now_ms())
    emit(k_nslog, 'namespace_created', {'epoch', epoch, 'actor', actor})
  end
end
local m = redis.call('HMGET', k_meta, 'state', 'epoch', 'seq', 'floor')
return {'OK', m[1], m[2] or '', m[3] or '0', m[4] or '0'}
