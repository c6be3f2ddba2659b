-- mc_queue: fail
-- Record a running Attempt's classified failure: only with the current fence and a live lease.
-- The Attempt becomes failed (terminal) and, in the same step, the policy's decision is applied:
-- wait (task failed until a person retries), retry (Attempt N+1 after a backoff), stop (task
-- blocked, attention item) or quarantine (dead-lettered). The same failure sent again (same fence,
-- same failure digest) is a no-op success. Counts the finished Attempt (claim to end) in stats.
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
-- KEYS[12] stats     counters for metrics (refusals, expiries, decisions; here also the finished Attempt:
--                    fin|<queue>|<handler>|failed|<bucket>, fin_ms|<queue>|<handler>)
-- KEYS[13] fence     the task's fence counter
-- KEYS[14] lease     the task's lease key
-- KEYS[15] done      the queue's finished tasks (succeeded, canceled) -> when (ms)
-- KEYS[16] held      the queue's tasks waiting for a person (failed, blocked, quarantined)
-- KEYS[17] released  tasks that ended with dependents waiting (the sweeper's release.lua)
-- KEYS[18] slotheld  concurrency slots held (the Attempt's return: slots_free)
-- KEYS[19] slotwait  Attempts waiting for a slot (the first of a returned slot's key is woken)
-- KEYS[20] slotwake  waiters to wake (slot_wake.lua)
-- KEYS[21] spent     spend ceilings' reservations and buckets (the Attempt's reservation replaced by its spend)
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
-- ARGV[12] proof           claim sequence of the fence when the caller's client was issued it, or ''
-- ARGV[13] decision        '' | 'wait' | 'retry' | 'stop' | 'quarantine'
-- ARGV[14] why             the decision's reason, recorded
-- ARGV[15] next_reason     reason recorded on Attempt N+1 (retry)
-- ARGV[16] next_hypothesis hypothesis recorded on Attempt N+1 (retry)
-- ARGV[17] delay_ms        backoff before Attempt N+1 is due (retry)
-- ARGV[18] attention       attention item JSON (stop, quarantine)
-- ARGV[19] budget          which budget ran out, or ''
-- Returns: {'OK', ended_at, attempt_fields, task_state} | {'DUP', ended_at, attempt_fields}
--          {'E_CONFLICT', recorded_digest}
--          {'E_STALE'|'E_STATE'|'E_EXPIRED', current_fence, attempt_state, lease_exp}
--          {'E_CANCELED', reason} (a cancel was requested: acknowledge instead)
--          {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_NONS', why} | {'E_BADARG', why}
-- Events: attempt_failed | attempt_created | attention_raised | task_quarantined | failure_conflict
--         | stale_write_refused
-- Idempotent: yes (fence + failure digest)
--@include common
--@include fenced
--@include decisions

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], counts = KEYS[4], leases = KEYS[5],
  task = KEYS[6], attempts = KEYS[7], events = KEYS[8], pending = KEYS[9], attention = KEYS[10],
  dlq = KEYS[11], stats = KEYS[12], fence = KEYS[13], lease = KEYS[14],
  done = KEYS[15], held = KEYS[16], released = KEYS[17], slotheld = KEYS[18], slotwait = KEYS[19], slotwake = KEYS[20],
  spent = KEYS[21]}
bind_task(K)
local A, bad = args(ARGV, with({
  'n', 'int', 1, MAX_N,
  'fence', 'int', 0, MAX_INT,
  'worker', 'text', 200, false,
  'failure', 'json', 131072, 'obj',
  'failure_digest', 'hex', 64, false,
  'fclass', 'enum', '|authorization|configuration|capacity|provider|executor|validation|repository|internal|', false,
  'fingerprint', 'hex', 16, false,
  'cost', 'dec', 1e9, false,
  'tokens', 'int', 0, 1e12,
}, fenced_args(), decision_args()))
if bad then return bad end
bad = decision_error(A) or failure_error(A.failure, A.fclass, A.fingerprint)
if bad then return bad end
local n = A.raw.n
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, A.min_seq, A.worker, true)
if err then return err end

local a = redis.call('HMGET', K.attempts, n .. '.state', n .. '.fence', n .. '.failure_digest', n .. '.ended_at')
-- A replay only when the worker itself recorded this failure with this fence (a reconciled one has no digest).
if a[1] == 'failed' and a[2] == A.raw.fence and a[3] then
  if a[3] == A.failure_digest then return {'DUP', a[4], attempt_snapshot(K.attempts, K.task, n)} end
  return refuse(K.events, K.stats, 'failure_conflict', {'E_CONFLICT', a[3]},
    {'attempt', n, 'worker', A.worker, 'fence', A.raw.fence, 'payload_digest', A.failure_digest, 'recorded_digest', a[3]})
end

local ts
err, ts = fence_check(K, A, A.worker, A.failure_digest, 'fail', true)
if err then return err end

local t = redis.call('HMGET', K.task, 'queue', 'id', 'handler')
local own = redis.call('HMGET', K.attempts, n .. '.started_at', n .. '.slots', n .. '.slots_at', n .. '.spend')
local started = tonumber(own[1]) or ts
aset(K.attempts, n, {'state', 'failed', 'ended_at', ts, 'elapsed_ms', ts - started, 'failure', A.failure,
  'failure_digest', A.failure_digest, 'fclass', A.fclass, 'fingerprint', A.fingerprint})
if tonumber(A.cost) > 0 then redis.call('HINCRBYFLOAT', K.attempts, n .. '.cost', A.cost) end  -- 0: not written
if A.tokens > 0 then redis.call('HINCRBY', K.attempts, n .. '.tokens', A.raw.tokens) end
redis.call('ZREM', K.leases, t[2] .. '/' .. n)
redis.call('DEL', K.lease)
slots_free(K, n, t[2] .. '/' .. n, ts, {own[2], own[3]})
if own[4] then spend_settle(K, n, t[2] .. '/' .. n, ts) end
emit(K.events, 'attempt_failed', {'attempt', n, 'worker', A.worker, 'fence', A.raw.fence, 'failure_class', A.fclass,
  'fingerprint', A.fingerprint, 'decision', A.decision, 'why', A.why})
local state = apply_decision(K, t[2], t[1], n, 'running', A, 'policy', ts)
observe(K.stats, t[3], 'fin', t[1], 'failed', ts - started)
return {'OK', ts, attempt_snapshot(K.attempts, K.task, n), state}
