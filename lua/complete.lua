-- mc_queue: complete
-- Record a running Attempt's success: only with the current fence and a live lease. The same
-- completion sent again (same fence, same result) is a no-op success; a different result with
-- the same fence is a conflict.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] counts     "<queue>|<state>" counters
-- KEYS[5] leases     lease expiry index
-- KEYS[6] task       task hash
-- KEYS[7] attempts   attempts hash
-- KEYS[8] events     task event stream
-- KEYS[9] stats      counters for metrics (refusals, expiries, decisions)
-- ARGV[1] n              attempt number
-- ARGV[2] fence          fence the caller holds
-- ARGV[3] worker         worker id
-- ARGV[4] result         result JSON
-- ARGV[5] result_digest  sha256 of the canonical result
-- ARGV[6] cost           cost to add to what the Attempt was charged (decimal string)
-- ARGV[7] tokens         tokens to add
-- ARGV[8] epoch
-- ARGV[9] min_seq
-- Returns: {'OK', ended_at, attempt_fields} | {'DUP', ended_at, attempt_fields}
--          {'E_CONFLICT', recorded_digest}
--          {'E_STALE'|'E_STATE'|'E_EXPIRED', current_fence, attempt_state, lease_exp}
--          {'E_CANCELED', reason} (a cancel was requested: acknowledge instead)
--          {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_BADARG', why}
-- Events: attempt_succeeded | completion_conflict | stale_write_refused
-- Idempotent: yes (fence + result digest)
--@include common

local k_meta, k_epochs, k_nslog, k_counts, k_leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local k_task, k_att, k_ev = KEYS[6], KEYS[7], KEYS[8]
local k_stats = KEYS[9]
local n, fence, worker, result, digest = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local cost, tokens, epoch, min_seq = ARGV[6], ARGV[7], ARGV[8], ARGV[9]

local a = redis.call('HMGET', k_att, n .. '.state', n .. '.fence', n .. '.result_digest', n .. '.ended_at')
-- A replay only when the worker itself recorded this success (a reconciled one has no digest).
if a[1] == 'succeeded' and a[2] == fence and a[3] then
  if a[3] == digest then return {'DUP', a[4], attempt_snapshot(k_att, n)} end
  emit(k_ev, 'completion_conflict', {'attempt', n, 'worker', worker, 'fence', fence,
    'payload_digest', digest, 'recorded_digest', a[3]})
  return {'E_CONFLICT', a[3]}
end

local err = ns_check(k_meta, k_epochs, k_nslog, epoch, min_seq, worker, true)
if err then return err end
local ts = now_ms()
err = fence_check(k_meta, k_nslog, k_stats, k_task, k_att, k_ev, n, fence, worker, digest, 'complete', ts)
if err then return err end
err = cancel_check(k_task, k_ev, n, worker, digest, 'complete')
if err then return err end

local t = redis.call('HMGET', k_task, 'queue', 'id')
local started = tonumber(aget(k_att, n, 'started_at'))
aset(k_att, n, {'state', 'succeeded', 'ended_at', ts, 'elapsed_ms', ts - started, 'result', result,
  'result_digest', digest})
redis.call('HINCRBYFLOAT', k_att, n .. '.cost', cost)
redis.call('HINCRBY', k_att, n .. '.tokens', tokens)
redis.call('HSET', k_task, 'state', 'succeeded', 'active', '', 'updated_at', ts, 'result', result)
redis.call('ZREM', k_leases, t[2] .. '/' .. n)
move_count(k_counts, t[1], 'running', 'succeeded')
emit(k_ev, 'attempt_succeeded', {'attempt', n, 'worker', worker, 'fence', fence, 'result_digest', digest})
return {'OK', ts, attempt_snapshot(k_att, n)}
