-- mc_queue: cancel_ack
-- The executor acknowledges a cancel request: it gives up its lease (the fence moves on, so it can
-- write nothing more) and its Attempt waits for reconciliation, which settles it as canceled.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] leases     lease expiry index
-- KEYS[5] suspect    suspect index
-- KEYS[6] cancels    running attempts with a cancel request
-- KEYS[7] task       task hash
-- KEYS[8] attempts   attempts hash
-- KEYS[9] events     task event stream
-- KEYS[10] stats     counters for metrics (refusals, expiries, decisions)
-- KEYS[11] fence     the task's fence counter
-- KEYS[12] lease     the task's lease key
-- KEYS[13] slotheld  concurrency slots held (the Attempt's return: slots_free)
-- KEYS[14] slotwait  Attempts waiting for a slot (the first of a returned slot's key is woken)
-- KEYS[15] slotwake  waiters to wake (slot_wake.lua)
-- KEYS[16] spent     spend ceilings' reservations and buckets (the Attempt's reservation replaced by its spend)
-- ARGV[1] n          attempt number
-- ARGV[2] fence      fence the executor holds
-- ARGV[3] worker     worker id
-- ARGV[4] request_id a resend with the same id (after the fence moved) reports the same acknowledgement
-- ARGV[5] epoch
-- ARGV[6] min_seq
-- ARGV[7] proof      claim sequence of the fence when the caller's client was issued it, or ''
-- Returns: {'OK', new_fence} | {'DUP', new_fence} | {'E_CANCEL', why} (no cancel requested)
--          {'E_STALE'|'E_STATE'|'E_EXPIRED', current_fence, attempt_state, lease_exp}
--          {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_NONS', why} | {'E_BADARG', why}
-- Events: cancel_acknowledged | cancel_ack_refused | stale_write_refused
-- Idempotent: by request id
--@include common
--@include fenced

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], leases = KEYS[4], suspect = KEYS[5],
  cancels = KEYS[6], task = KEYS[7], attempts = KEYS[8], events = KEYS[9], stats = KEYS[10],
  fence = KEYS[11], lease = KEYS[12], slotheld = KEYS[13], slotwait = KEYS[14], slotwake = KEYS[15],
  spent = KEYS[16]}
bind_task(K)
local A, bad = args(ARGV, with({
  'n', 'int', 1, MAX_N,
  'fence', 'int', 0, MAX_INT,
  'worker', 'text', 200, false,
  'request_id', 'reqid', false, false,
}, fenced_args()))
if bad then return bad end
local n = A.raw.n
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, A.min_seq, A.worker, true)
if err then return err end
if A.request_id ~= '' then
  local a = redis.call('HMGET', K.attempts, n .. '.cancel_ack_req', n .. '.fence', n .. '.cancel_ack_fence')
  if a[1] == A.request_id and a[2] == A.raw.fence then return {'DUP', a[3]} end
end
local ts
err, ts = fence_check(K, A, A.worker, 'cancel_ack', 'cancel_ack', false)
if err then return err end
local t = redis.call('HMGET', K.task, 'cancel_requested', 'id', 'fence')
if not t[1] then
  return refuse(K.events, K.stats, 'cancel_ack_refused', {'E_CANCEL', 'no cancellation was requested'},
    {'attempt', n, 'worker', A.worker, 'reason', 'no cancellation was requested'})
end
local id = t[2]
local new_fence = fmt(next_fence(K.meta, K.fence, K.task, t[3]))
redis.call('HSET', K.task, 'updated_at', ts)
aset(K.attempts, n, {'state', 'suspect', 'suspect_at', ts, 'cancel_ack_at', ts, 'cancel_ack_req', A.request_id,
  'cancel_ack_fence', new_fence})
redis.call('DEL', K.lease)
redis.call('ZREM', K.leases, id .. '/' .. n)
local took = redis.call('HMGET', K.attempts, n .. '.slots', n .. '.slots_at', n .. '.spend', n .. '.cost',
  n .. '.tokens')  -- (what it holds: slots and reservations, returned below)
slots_free(K, n, id .. '/' .. n, ts, {took[1], took[2]})
if took[3] then spend_settle(K, n, id .. '/' .. n, ts, {took[3], took[4], took[5]}) end
redis.call('ZREM', K.cancels, id .. '/' .. n)
redis.call('ZADD', K.suspect, ts, id .. '/' .. n)
emit(K.events, 'cancel_acknowledged', {'attempt', n, 'worker', A.worker, 'fence', A.raw.fence, 'new_fence', new_fence})
return {'OK', new_fence}
