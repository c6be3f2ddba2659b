-- mc_queue: init
-- Create the namespace meta on first use, or report it. When Redis has no meta but the namespace
-- left traces (its queue set or lease index) or a witness (a file the embedded server keeps beside
-- its data) remembers an epoch, Redis lost state: the namespace is created in state "lost" so that
-- nothing runs until `mcq recover`. A Redis that lost everything and has no witness looks new.
-- Only writers call init; reads never create a namespace.
-- KEYS[1] meta          namespace meta hash
-- KEYS[2] nslog         namespace event stream
-- KEYS[3] queues        set of queue names (a trace of earlier use)
-- KEYS[4] leases        lease expiry index (a trace of earlier use)
-- ARGV[1] nonce         random part of the epoch created when the namespace is new
-- ARGV[2] witness       epoch a witness remembers, or ''
-- ARGV[3] actor         who asks
-- ARGV[4] max_lease_ms  the namespace's lease ceiling, recorded when it is created
-- Returns: {'OK', state, epoch, seq, floor} | {'E_SCHEMA', schema} (made by another mc_queue version)
--          {'E_BADARG', why}
-- Events (nslog): namespace_created | state_loss_detected
-- Idempotent: yes (creates only when missing)
--@include common

local K = {meta = KEYS[1], nslog = KEYS[2], queues = KEYS[3], leases = KEYS[4]}
local A, bad = args(ARGV, {
  'nonce', 'hex', 8, false,
  'witness', 'epoch', false, false,
  'actor', 'id', 200, false,
  'max_lease_ms', 'int', 1000, 7 * DAY_MS,
})
if bad then return bad end
if A.witness ~= '' and not string.find(A.witness, '^%d+%.%x+$') then
  return {'E_BADARG', "witness must be '' or an epoch '<time>.<nonce>'"}
end

if redis.call('EXISTS', K.meta) == 0 then
  local traces = redis.call('EXISTS', K.queues, K.leases)
  if A.witness ~= '' or traces > 0 then
    redis.call('HSET', K.meta, 'epoch', A.witness, 'schema', SCHEMA, 'max_lease_ms', A.max_lease_ms)
    local why = (A.witness ~= '') and ('the witness remembers epoch ' .. A.witness) or 'the namespace still holds tasks'
    mark_lost(K.meta, K.nslog, 'namespace meta is missing but ' .. why .. ': Redis lost state', A.actor)
  else
    local epoch = new_epoch(A.nonce)
    redis.call('HSET', K.meta, 'state', 'ok', 'epoch', epoch, 'seq', 0, 'floor', 0, 'created_at', now_ms(),
      'run_id', run_id() or '', 'schema', SCHEMA, 'max_lease_ms', A.max_lease_ms)
    emit(K.nslog, 'namespace_created', {'epoch', epoch, 'actor', A.actor, 'max_lease_ms', A.max_lease_ms})
  end
end
local m = redis.call('HMGET', K.meta, 'state', 'epoch', 'seq', 'floor', 'schema')
if m[5] ~= SCHEMA then return {'E_SCHEMA', tostring(m[5])} end
return {'OK', m[1], m[2] or '', m[3] or '0', m[4] or '0'}
