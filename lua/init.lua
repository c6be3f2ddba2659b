-- mc_queue: init
-- Create the namespace meta on first use, or report it. When Redis has no meta but the namespace
-- left traces (its queue set or lease index) or a witness (a file the embedded server keeps beside
-- its data) remembers an epoch, Redis lost state: the namespace is created in state "lost" so that
-- nothing runs until `mcq recover`. A Redis that lost everything and has no witness looks new.
-- KEYS[1] meta     namespace meta hash
-- KEYS[2] nslog    namespace event stream
-- KEYS[3] queues   set of queue names (a trace of earlier use)
-- KEYS[4] leases   lease expiry index (a trace of earlier use)
-- ARGV[1] nonce    random part of the epoch created when the namespace is new
-- ARGV[2] witness  epoch a witness remembers, or ''
-- ARGV[3] actor    who asks
-- Returns: {'OK', state, epoch, seq, floor}
-- Events (nslog): namespace_created | state_loss_detected
-- Idempotent: yes (creates only when missing)
--@include common

local k_meta, k_nslog, k_queues, k_leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local nonce, witness, actor = ARGV[1], ARGV[2], ARGV[3]

if redis.call('EXISTS', k_meta) == 0 then
  local traces = redis.call('EXISTS', k_queues, k_leases)
  if witness ~= '' or traces > 0 then
    redis.call('HSET', k_meta, 'epoch', witness)
    local why = (witness ~= '') and ('the witness remembers epoch ' .. witness) or 'the namespace still holds tasks'
    mark_lost(k_meta, k_nslog, 'namespace meta is missing but ' .. why .. ': Redis lost state', actor)
  else
    local epoch = new_epoch(nonce)
    redis.call('HSET', k_meta, 'state', 'ok', 'epoch', epoch, 'seq', 0, 'floor', 0, 'created_at', now_ms(),
      'run_id', run_id() or '')
    emit(k_nslog, 'namespace_created', {'epoch', epoch, 'actor', actor})
  end
end
local m = redis.call('HMGET', k_meta, 'state', 'epoch', 'seq', 'floor')
return {'OK', m[1], m[2] or '', m[3] or '0', m[4] or '0'}
