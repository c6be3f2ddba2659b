-- mc_queue: recover_begin
-- First step of `mcq recover` after Redis lost state: retire the old epoch, raise the fence floor
-- above every fence that can ever have been issued (Redis TIME in microseconds), and hold the
-- namespace in "recovering" while every live lease is voided (expire with force=1 and this epoch).
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- ARGV[1] nonce      random part of the new epoch
-- ARGV[2] actor
-- ARGV[3] reason     why, recorded
-- Returns: {'OK', epoch, floor} (when already recovering: the epoch and floor in progress) | {'E_BADARG', why}
-- Events (nslog): recovery_started
-- Idempotent: yes (a rerun while recovering continues the same recovery)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3]}
local A, bad = args(ARGV, {
  'nonce', 'hex', 8, false,
  'actor', 'id', 200, false,
  'reason', 'text', 2000, false,
})
if bad then return bad end
local m = redis.call('HMGET', K.meta, 'state', 'epoch', 'floor')
if m[1] == 'recovering' then return {'OK', m[2], m[3]} end
local floor = now_us()
if tonumber(m[3] or '0') >= floor then floor = tonumber(m[3]) + 1 end
if m[2] and m[2] ~= '' then redis.call('SADD', K.epochs, m[2]) end
local epoch = new_epoch(A.nonce)
redis.call('HSET', K.meta, 'state', 'recovering', 'epoch', epoch, 'floor', fmt(floor), 'recovered_at', now_ms(),
  'run_id', run_id() or '')
if redis.call('HEXISTS', K.meta, 'seq') == 0 then redis.call('HSET', K.meta, 'seq', 0) end
redis.call('HSETNX', K.meta, 'schema', SCHEMA)
emit(K.nslog, 'recovery_started', {'actor', A.actor, 'reason', A.reason, 'old_epoch', m[2] or '', 'epoch', epoch,
  'old_state', m[1] or 'missing', 'floor', fmt(floor)})
return {'OK', epoch, fmt(floor)}
