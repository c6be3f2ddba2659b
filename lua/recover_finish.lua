-- mc_queue: recover_finish
-- Last step of `mcq recover`: every lease issued before the recovery has been voided; the
-- namespace accepts claims again.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] nslog      namespace event stream
-- ARGV[1] epoch      the epoch recover_begin issued
-- ARGV[2] actor
-- ARGV[3] voided     how many leases were voided
-- Returns: {'OK', epoch} | {'E_STATE', state} (not recovering, or another recovery's epoch)
-- Events (nslog): recovery_finished
-- Idempotent: yes
--@include common

local k_meta, k_nslog = KEYS[1], KEYS[2]
local m = redis.call('HMGET', k_meta, 'state', 'epoch')
if m[1] == 'ok' and m[2] == ARGV[1] then return {'OK', ARGV[1]} end
if m[1] ~= 'recovering' or m[2] ~= ARGV[1] then return {'E_STATE', tostring(m[1]) .. ' ' .. tostring(m[2])} end
redis.call('HSET', k_meta, 'state', 'ok')
redis.call('HDEL', k_meta, 'lost_reason', 'lost_at')
emit(k_nslog, 'recovery_finished', {'actor', ARGV[2], 'epoch', ARGV[1], 'voided_leases', ARGV[3]})
return {'OK', ARGV[1]}
