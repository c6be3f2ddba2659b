-- mc_queue: fail
-- Record a running Attempt's classified failure: only with the current fence and a live lease.
-- The Attempt becomes failed (terminal) and the task failed, waiting for a decision (retry_task).
-- The same failure sent again (same fence, same failure digest) is a no-op success.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] counts     "<queue>|<state>" counters
-- KEYS[5] leases     lease expiry index
-- KEYS[6] task       task hash
-- KEYS[7] attempts   attempts hash
-- KEYS[8] events     task event stream
-- ARGV[1] n               attempt number
-- ARGV[2] fence           fence the caller holds
-- ARGV[3] worker          worker id
-- ARGV[4] failure         failure JSON (class, type, message, fingerprint)
-- ARGV[5] failure_digest  sha256 of the canonical failure
-- ARGV[6] fclass          failure class
-- ARGV[7] fingerprint     stable failure fingerprint
-- ARGV[8] cost
-- ARGV[9] tokens
-- ARGV[10] epoch
-- ARGV[11] min_seq
-- Returns: {'OK', ended_at, attempt_fields} | {'DUP', ended_at, attempt_fields} | {'E_CONFLICT', recorded_digest}
--          {'E_STALE'|'E_STATE'|'E_EXPIRED', current_fence, attempt_state, lease_exp}
--          {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_BADARG', why}
-- Events: attempt_failed | stale_write_refused
-- Idempotent: yes (fence + failure digest)
--@include common

local k_meta, k_epochs, k_nslog, k_counts, k_leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local k_task, k_att, k_ev = KEYS[6], KEYS[7], KEYS[8]
local n, fence, worker, failure, digest, fclass, fingerprint = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local cost, tokens, epoch, min_seq = ARGV[8], ARGV[9], ARGV[10], ARGV[11]

local a = redis.call('HMGET', k_att, n .. '.state', n .. '.fence', n .. '.failure_digest', n .. '.ended_at')
-- A replay only when the worker itself recorded this failure (a reconciled one has no digest).
if a[1] == 'failed' and a[2] == fence and a[3] then
  if a[3] == digest then return {'DUP', a[4], attempt_snapshot(k_att, n)} end
  return {'E_CONFLICT', a[3] or ''}
end

local err = ns_check(k_meta, k_epochs, k_nslog, epoch, min_seq, worker, true)
if err then return err end
local ts = now_ms()
err = fence_check(k_meta, k_nslog, k_task, k_att, k_ev, n, fence, worker, digest, 'fail', ts)
if err then return err end

local t = redis.call('HMGET', k_task, 'queue', 'id')
local started = tonumber(aget(k_att, n, 'started_at'))
aset(k_att, n, {'state', 'failed', 'ended_at', ts, 'elapsed_ms', ts - started, 'failure', failure,
  'failure_digest', digest, 'fclass', fclass, 'fingerprint', fingerprint, 'cost', cost, 'tokens', tokens})
redis.call('HSET', k_task, 'state', 'failed', 'active', '', 'updated_at', ts)
redis.call('ZREM', k_leases, t[2] .. '/' .. n)
move_count(k_counts, t[1], 'running', 'failed')
emit(k_ev, 'attempt_failed', {'attempt', n, 'worker', worker, 'fence', fence, 'failure_class', fclass,
  'fingerprint', fingerprint})
return {'OK', ts, attempt_snapshot(k_att, n)}
