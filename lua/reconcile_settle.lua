-- mc_queue: reconcile_settle
-- Settle a reconciling Attempt with the decision and the evidence it rests on. succeeded: the
-- work is proven done, the task succeeds. failed: the policy's decision is applied in the same
-- step (wait for a person, retry as Attempt N+1, stop with an attention item, or quarantine).
-- canceled: the last step of the cancellation protocol; the Attempt and the task end canceled.
-- Counts the finished Attempt (claim to settlement) in stats.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] counts     "<queue>|<state>" counters
-- KEYS[5] suspect    suspect index
-- KEYS[6] task       task hash
-- KEYS[7] attempts   attempts hash
-- KEYS[8] events     task event stream
-- KEYS[9] pending    the queue's pending index
-- KEYS[10] attention attention items (task id -> JSON)
-- KEYS[11] dlq       quarantined tasks (task id -> time)
-- KEYS[12] stats     counters for metrics (refusals, expiries, decisions; here also the finished Attempt:
--                    fin|<queue>|<handler>|<outcome>|<bucket>, fin_ms|<queue>|<handler>)
-- KEYS[13] done      the queue's finished tasks (succeeded, canceled) -> when (ms)
-- KEYS[14] held      the queue's tasks waiting for a person (failed, blocked, quarantined)
-- KEYS[15] released  tasks that ended with dependents waiting (the sweeper's release.lua)
-- ARGV[1] n               attempt number
-- ARGV[2] actor           reconciler id
-- ARGV[3] outcome         'succeeded' | 'failed' | 'canceled'
-- ARGV[4] result          result JSON when succeeded, else ''
-- ARGV[5] failure         failure JSON when failed, else ''
-- ARGV[6] fclass          failure class, or ''
-- ARGV[7] fingerprint     failure fingerprint, or ''
-- ARGV[8] evidence        evidence JSON the decision rests on
-- ARGV[9] epoch           namespace epoch the caller knows
-- ARGV[10] decision        '' | 'wait' | 'retry' | 'stop' | 'quarantine' (failed only)
-- ARGV[11] why             the decision's reason, recorded
-- ARGV[12] next_reason     reason recorded on Attempt N+1 (retry)
-- ARGV[13] next_hypothesis hypothesis recorded on Attempt N+1 (retry)
-- ARGV[14] delay_ms        backoff before Attempt N+1 is due (retry)
-- ARGV[15] attention       attention item JSON (stop, quarantine)
-- ARGV[16] budget          which budget ran out, or ''
-- Returns: {'OK', ended_at, attempt_fields, task_state} | {'DUP', ended_at, attempt_fields}
--          {'E_STATE', attempt_state} | {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current}
--          {'E_BADARG', why}
-- Events: attempt_reconciled | attempt_created | attention_raised | task_quarantined | task_canceled
--         | settle_refused
-- Idempotent: yes (a settled Attempt is reported, not settled again)
--@include common
--@include decisions

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], counts = KEYS[4], suspect = KEYS[5],
  task = KEYS[6], attempts = KEYS[7], events = KEYS[8], pending = KEYS[9],
  attention = KEYS[10], dlq = KEYS[11], stats = KEYS[12], done = KEYS[13], held = KEYS[14], released = KEYS[15]}
bind_task(K)
local A, bad = args(ARGV, with({
  'n', 'int', 1, MAX_N,
  'actor', 'text', 200, false,
  'outcome', 'enum', '|succeeded|failed|canceled|', false,
  'result', 'json?', 524288, false,
  'failure', 'json?', 131072, 'obj',
  'fclass', 'enum', '||authorization|configuration|capacity|provider|executor|validation|repository|internal|', false,
  'fingerprint', 'hex?', 16, false,
  'evidence', 'json', 262144, false,
  'epoch', 'epoch', false, false,
}, decision_args()))
if bad then return bad end
if A.outcome == 'failed' then
  if A.failure == '' or A.fclass == '' or A.fingerprint == '' then
    return {'E_BADARG', 'failure: a failed outcome needs its failure, class and fingerprint'}
  end
  bad = failure_error(A.failure, A.fclass, A.fingerprint)
  if bad then return bad end
elseif A.decision ~= '' then
  return {'E_BADARG', 'decision: only a failure takes a decision'}
end
if A.outcome == 'succeeded' and A.result == '' then return {'E_BADARG', 'result: a success needs its result'} end
bad = decision_error(A)
if bad then return bad end
local n = A.raw.n
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end
local t = redis.call('HMGET', K.task, 'id', 'queue', 'state', 'handler')
if not t[1] then return {'E_NOTASK', 'no such task'} end
local a = redis.call('HMGET', K.attempts, n .. '.state', n .. '.ended_at', n .. '.settled_by')
if a[1] == A.outcome and a[3] == 'reconcile' then return {'DUP', a[2], attempt_snapshot(K.attempts, K.task, n)} end
if a[1] ~= 'reconciling' then
  return refuse(K.events, K.stats, 'settle_refused', {'E_STATE', tostring(a[1])},
    {'attempt', n, 'actor', A.actor, 'outcome', A.outcome, 'reason', 'only a reconciling attempt is settled',
     'attempt_state', tostring(a[1])})
end

local ts = now_ms()
local started = tonumber(aget(K.attempts, n, 'started_at')) or ts
aset(K.attempts, n, {'state', A.outcome, 'ended_at', ts, 'elapsed_ms', ts - started, 'settled_by', 'reconcile',
  'evidence', A.evidence})
redis.call('ZREM', K.suspect, t[1] .. '/' .. n)
local final = DECISIONS[A.decision]
if A.outcome ~= 'failed' then final = A.outcome elseif A.decision == 'retry' and A.delay_ms <= 0 then final = 'pending' end
redis.call('HINCRBY', K.stats, 'reconciled:' .. A.outcome, 1)
emit(K.events, 'attempt_reconciled', {'attempt', n, 'actor', A.actor, 'outcome', A.outcome, 'task_state', final,
  'failure_class', A.fclass, 'evidence', A.evidence, 'decision', A.decision, 'why', A.why})
local state
if A.outcome == 'canceled' then
  redis.call('HSET', K.task, 'state', 'canceled', 'active', '', 'updated_at', ts)
  move_count(K.counts, t[2], t[3], 'canceled', K.task)
  index_end(K, t[1], t[3], 'canceled', ts)
  emit(K.events, 'task_canceled', {'attempt', n, 'actor', A.actor,
    'reason', redis.call('HGET', K.task, 'cancel_requested') or ''})
  state = 'canceled'
elseif A.outcome == 'succeeded' then
  aset(K.attempts, n, {'result', A.result})
  redis.call('HSET', K.task, 'state', 'succeeded', 'active', '', 'updated_at', ts)  -- (the result is the Attempt's)
  move_count(K.counts, t[2], t[3], 'succeeded', K.task)
  index_end(K, t[1], t[3], 'succeeded', ts)
  state = 'succeeded'
else
  aset(K.attempts, n, {'failure', A.failure, 'fclass', A.fclass, 'fingerprint', A.fingerprint})
  state = apply_decision(K, t[1], t[2], n, t[3], A, A.actor, ts)
end
observe(K.stats, t[4], 'fin', t[2], A.outcome, ts - started)
return {'OK', ts, attempt_snapshot(K.attempts, K.task, n), state}
