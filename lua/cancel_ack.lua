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
-- KEYS[10] stats      counters for metrics (refusals, expiries, decisions)
-- ARGV[1] n          attempt number
-- ARGV[2] fence      fence the executor holds
-- ARGV[3] worker     worker id
-- ARGV[4] epoch
-- ARGV[5] min_seq
-- Returns: {'OK', new_fence} | {'E_CANCEL', why} (no cancel requested)
--          {'E_STALE'|'E_STATE'|'E_EXPIRED', current_fence, attempt_state, lease_exp}
--          {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_BADARG', why}
-- Events: cancel_acknowledged | stale_write_refused
-- Idempotent: no second ack is possible (the fence moved); a resend is refused as stale and audited
--@include common

local k_meta, k_epochs, k_nslog, k_leases, k_suspect, k_cancels = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local k_task, k_att, k_ev = KEYS[7], KEYS[8], KEYS[9]
local k_stats = KEYS[10]
local n, fence, worker, epoch, min_seq = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local err = ns_check(k_meta, k_epochs, k_nslog, epoch, min_seq, worker, true)
if err then return err end
local ts = now_ms()
err = fence_check(k_meta, k_nslog, k_stats, k_task, k_att, k_ev, n, fence, worker, 'cancel_ack', 'cancel_ack',
  ts)
if err then return err end
if not redis.call('HGET', k_task, 'cancel_requested') then return {'E_CANCEL', 'no cancellation was requested'} end
local id = redis.call('HGET', k_task, 'id')
local new_fence = next_fence(k_meta, redis.call('HGET', k_task, 'fence'))
redis.call('HSET', k_task, 'fence', fmt(new_fence), 'updated_at', ts)
aset(k_att, n, {'state', 'suspect', 'suspect_at', ts, 'cancel_ack_at', ts})
redis.call('ZREM', k_leases, id .. '/' .. n)
redis.call('ZREM', k_cancels, id .. '/' .. n)
redis.call('ZADD', k_suspect, ts, id .. '/' .. n)
emit(k_ev, 'cancel_acknowledged', {'attempt', n, 'worker', worker, 'fence', fence, 'new_fence', fmt(new_fence)})
return {'OK', fmt(new_fence)}
