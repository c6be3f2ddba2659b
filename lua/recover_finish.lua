-- mc_queue: recover_finish
-- Last step of `mcq recover`: every lease issued before the recovery has been voided; the
-- namespace accepts claims again.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] nslog      namespace event stream
-- KEYS[3] leases     lease expiry index (must hold no lease from before the recovery)
-- ARGV[1] epoch      the epoch recover_begin issued
-- ARGV[2] actor
-- ARGV[3] voided     how many leases were voided
-- Returns: {'OK', epoch} | {'E_STATE', state} (not recovering, another recovery's epoch, or leases left)
--          {'E_BADARG', why}
-- Events (nslog): recovery_finished | recovery_refused
-- Idempotent: yes
--@include common

local K = {meta = KEYS[1], nslog = KEYS[2], leases = KEYS[3]}
local A, bad = args(ARGV, {
  'epoch', 'epoch', false, false,
  'actor', 'id', 200, false,
  'voided', 'int', 0, MAX_INT,
})
if bad then return bad end
local m = redis.call('HMGET', K.meta, 'state', 'epoch', 'recovered_at')
if m[1] == 'ok' and m[2] == A.epoch then return {'OK', A.epoch} end
local why = nil
if m[1] ~= 'recovering' or m[2] ~= A.epoch then
  why = 'the namespace is ' .. tostring(m[1]) .. ' with epoch ' .. tostring(m[2]) .. ', not recovering to ' .. A.epoch
else
  local left = redis.call('ZRANGEBYSCORE', K.leases, '-inf', '+inf', 'LIMIT', 0, 1)
  if #left > 0 then why = 'lease ' .. left[1] .. ' from before the recovery is still indexed' end
end
if why then
  return refuse(K.nslog, nil, 'recovery_refused', {'E_STATE', why}, {'actor', A.actor, 'epoch', A.epoch, 'reason', why})
end
redis.call('HSET', K.meta, 'state', 'ok')
redis.call('HDEL', K.meta, 'lost_reason', 'lost_at')
emit(K.nslog, 'recovery_finished', {'actor', A.actor, 'epoch', A.epoch, 'voided_leases', A.voided})
return {'OK', A.epoch}
