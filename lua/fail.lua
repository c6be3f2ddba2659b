-- mc_queue: fail
-- Record a running Attempt's classified failure: only with the current fence and a live lease.
-- The Attempt becomes failed (terminal) and, in the same step, the policy's decision is applied:
-- wait (task failed until a person retries), retry (Attempt N+1 after a backoff), stop (task
-- blocked, attention item) or quarantine (dead-lettered). The same failure sent again (same fence,
-- same failure digest) is a no-op success.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] counts     "<queue>|<state>" counters
-- KEYS[5] leases     lease expiry index
-- KEYS[6] task       task hash
-- KEYS[7] attempts   attempts hash
-- KEYS[8] events     task event stream
-- KEYS[9] pending    the queue's pending index
-- KEYS[10] attention attention items (task id -> JSON)
-- KEYS[11] dlq       quarantined tasks (task id -> time)
-- KEYS[12] outbox    attempts waiting to be dispatched to the transport
-- KEYS[13] stats      counters for metrics (refusals, expiries, decisions)
-- ARGV[1] n               attempt number
-- ARGV[2] fence           fence the caller holds
-- ARGV[3] worker          worker id
-- ARGV[4] failure         failure JSON (class, type, message, fingerprint)
-- ARGV[5] failure_digest  sha256 of the canonical failure
-- ARGV[6] fclass          failure class
-- ARGV[7] fingerprint     stable failure fingerprint
-- ARGV[8] cost            cost to add to what the Attempt was charged
-- ARGV[9] tokens          tokens to add
-- ARGV[10] epoch
-- ARGV[11] min_seq
-- ARGV[12] decision        '' | 'wait' | 'retry' | 'stop' | 'quarantine'
-- ARGV[13] why             the decision's reason, recorded
-- ARGV[14] next_reason     reason recorded on Attempt N+1 (retry)
-- ARGV[15] next_hypothesis hypothesis recorded on Attempt N+1 (retry)
-- ARGV[16] delay_ms        backoff before Attempt N+1 is due (retry)
-- ARGV[17] attention       attention item JSON (stop, quarantine)
-- ARGV[18] budget          which budget ran out, or ''
-- Returns: {'OK', ended_at, attempt_fields, task_state} | {'DUP', ended_at, attempt_fields}
--          {'E_CONFLICT', recorded_digest}
--          {'E_STALE'|'E_STATE'|'E_EXPIRED', current_fence, attempt_state, lease_exp}
--          {'E_CANCELED', reason} (a cancel was requested: acknowledge instead)
--          {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_BADARG', why}
-- Events: attempt_failed | attempt_created | attention_raised | task_quarantined | stale_write_refused
-- Idempotent: yes (fence + failure digest)
--@include common

local k_meta, k_epochs, k_nslog, k_counts, k_leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local k_task, k_att, k_ev = KEYS[6], KEYS[7], KEYS[8]
local k_pending, k_attention, k_dlq, k_outbox = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local k_stats = KEYS[13]
local n, fence, worker, failure, digest, fclass, fingerprint = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local cost, tokens, epoch, min_seq = ARGV[8], ARGV[9], ARGV[10], ARGV[11]
local d = {action = ARGV[12], why = ARGV[13], reason = ARGV[14], hypothesis = ARGV[15], delay_ms = tonumber(ARGV[16]),
  attention = ARGV[17], budget = ARGV[18], actor = 'policy', fclass = ARGV[6]}
if not DECISIONS[d.action] then return {'E_BADARG', 'unknown decision ' .. d.action} end
if not d.delay_ms or d.delay_ms < 0 then return {'E_BADARG', 'delay_ms must be >= 0'} end
if d.action == 'retry' and select(2, string.gsub(d.reason, '[^\128-\191]', '')) < 10 then
  return {'E_BADARG', 'a retry decision needs a reason of at least ten characters'}
end

local a = redis.call('HMGET', k_att, n .. '.state', n .. '.fence', n .. '.failure_digest', n .. '.ended_at')
-- A replay only when the worker itself recorded this failure (a reconciled one has no digest).
if a[1] == 'failed' and a[2] == fence and a[3] then
  if a[3] == digest then return {'DUP', a[4], attempt_snapshot(k_att, n)} end
  return {'E_CONFLICT', a[3] or ''}
end

local err = ns_check(k_meta, k_epochs, k_nslog, epoch, min_seq, worker, true)
if err then return err end
local ts = now_ms()
err = fence_check(k_meta, k_nslog, k_stats, k_task, k_att, k_ev, n, fence, worker, digest, 'fail', ts)
if err then return err end
err = cancel_check(k_task, k_ev, n, worker, digest, 'fail')
if err then return err end

local t = redis.call('HMGET', k_task, 'queue', 'id')
local started = tonumber(aget(k_att, n, 'started_at'))
aset(k_att, n, {'state', 'failed', 'ended_at', ts, 'elapsed_ms', ts - started, 'failure', failure,
  'failure_digest', digest, 'fclass', fclass, 'fingerprint', fingerprint})
redis.call('HINCRBYFLOAT', k_att, n .. '.cost', cost)
redis.call('HINCRBY', k_att, n .. '.tokens', tokens)
redis.call('ZREM', k_leases, t[2] .. '/' .. n)
emit(k_ev, 'attempt_failed', {'attempt', n, 'worker', worker, 'fence', fence, 'failure_class', fclass,
  'fingerprint', fingerprint, 'decision', d.action, 'why', d.why})
local state = apply_decision(k_task, k_att, k_ev, k_pending, k_outbox, k_counts, k_attention, k_dlq, k_stats,
  t[2], t[1], n,  'running', d, ts)
return {'OK', ts, attempt_snapshot(k_att, n), state}
