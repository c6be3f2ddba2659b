-- mc_queue: reconcile_settle
-- Settle a reconciling Attempt with the decision and the evidence it rests on. succeeded: the
-- work is proven done, the task succeeds. failed: the policy's decision is applied in the same
-- step (wait for a person, retry as Attempt N+1, stop with an attention item, or quarantine).
-- canceled: the last step of the cancellation protocol; the Attempt and the task end canceled.
-- KEYS[1] counts     "<queue>|<state>" counters
-- KEYS[2] suspect    suspect index
-- KEYS[3] task       task hash
-- KEYS[4] attempts   attempts hash
-- KEYS[5] events     task event stream
-- KEYS[6] pending    the queue's pending index
-- KEYS[7] outbox     attempts waiting to be dispatched to the transport
-- KEYS[8] attention  attention items (task id -> JSON)
-- KEYS[9] dlq        quarantined tasks (task id -> time)
-- KEYS[10] stats      counters for metrics (refusals, expiries, decisions)
-- ARGV[1] n               attempt number
-- ARGV[2] actor           reconciler id
-- ARGV[3] outcome         'succeeded' | 'failed' | 'canceled'
-- ARGV[4] result          result JSON when succeeded, else ''
-- ARGV[5] failure         failure JSON when failed, else ''
-- ARGV[6] fclass          failure class, or ''
-- ARGV[7] fingerprint     failure fingerprint, or ''
-- ARGV[8] evidence        evidence JSON the decision rests on
-- ARGV[9] decision        '' | 'wait' | 'retry' | 'stop' | 'quarantine' (failed only)
-- ARGV[10] why            the decision's reason, recorded
-- ARGV[11] next_reason    reason recorded on Attempt N+1 (retry)
-- ARGV[12] next_hypothesis hypothesis recorded on Attempt N+1 (retry)
-- ARGV[13] delay_ms       backoff before Attempt N+1 is due (retry)
-- ARGV[14] attention      attention item JSON (stop, quarantine)
-- ARGV[15] budget         which budget ran out, or ''
-- Returns: {'OK', ended_at, attempt_fields, task_state} | {'DUP', ended_at, attempt_fields}
--          {'E_STATE', attempt_state} | {'E_BADARG', why} | {'E_NOTASK', why}
-- Events: attempt_reconciled | attempt_created | attention_raised | task_quarantined | task_canceled
-- Idempotent: yes (a settled Attempt is reported, not settled again)
--@include common

local k_counts, k_suspect, k_task, k_att, k_ev = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local k_pending, k_outbox, k_attention, k_dlq = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local k_stats = KEYS[10]
local n, actor, outcome = ARGV[1], ARGV[2], ARGV[3]
local result, failure, fclass, fingerprint, evidence = ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local d = {action = ARGV[9], why = ARGV[10], reason = ARGV[11], hypothesis = ARGV[12], delay_ms = tonumber(ARGV[13]),
  attention = ARGV[14], budget = ARGV[15], actor = actor, fclass = ARGV[6]}

if outcome ~= 'succeeded' and outcome ~= 'failed' and outcome ~= 'canceled' then
  return {'E_BADARG', 'outcome must be succeeded, failed or canceled'}
end
if outcome ~= 'failed' and d.action ~= '' then return {'E_BADARG', 'only a failure takes a decision'} end
if not DECISIONS[d.action] then return {'E_BADARG', 'unknown decision ' .. d.action} end
if not d.delay_ms or d.delay_ms < 0 then return {'E_BADARG', 'delay_ms must be >= 0'} end
if d.action == 'retry' and select(2, string.gsub(d.reason, '[^\128-\191]', '')) < 10 then
  return {'E_BADARG', 'a retry decision needs a reason of at least ten characters'}
end
local t = redis.call('HMGET', k_task, 'id', 'queue', 'state')
if not t[1] then return {'E_NOTASK', 'no such task'} end
local a = redis.call('HMGET', k_att, n .. '.state', n .. '.ended_at', n .. '.settled_by')
if a[1] == outcome and a[3] == 'reconcile' then return {'DUP', a[2], attempt_snapshot(k_att, n)} end
if a[1] ~= 'reconciling' then return {'E_STATE', tostring(a[1])} end

local ts = now_ms()
local started = tonumber(aget(k_att, n, 'started_at')) or ts
aset(k_att, n, {'state', outcome, 'ended_at', ts, 'elapsed_ms', ts - started, 'settled_by', 'reconcile',
  'evidence', evidence})
redis.call('ZREM', k_suspect, t[1] .. '/' .. n)
local final = DECISIONS[d.action]
if outcome ~= 'failed' then final = outcome elseif d.action == 'retry' and d.delay_ms <= 0 then final = 'pending' end
redis.call('HINCRBY', k_stats, 'reconciled:' .. outcome, 1)
emit(k_ev, 'attempt_reconciled', {'attempt', n, 'actor', actor, 'outcome', outcome, 'task_state', final,
  'failure_class', fclass, 'evidence', evidence, 'decision', d.action, 'why', d.why})
local state
if outcome == 'canceled' then
  redis.call('HSET', k_task, 'state', 'canceled', 'active', '', 'updated_at', ts)
  move_count(k_counts, t[2], t[3], 'canceled')
  emit(k_ev, 'task_canceled', {'attempt', n, 'actor', actor,
    'reason', redis.call('HGET', k_task, 'cancel_requested') or ''})
  state = 'canceled'
elseif outcome == 'succeeded' then
  aset(k_att, n, {'result', result})
  redis.call('HSET', k_task, 'result', result, 'state', 'succeeded', 'active', '', 'updated_at', ts)
  move_count(k_counts, t[2], t[3], 'succeeded')
  state = 'succeeded'
else
  aset(k_att, n, {'failure', failure, 'fclass', fclass, 'fingerprint', fingerprint})
  state = apply_decision(k_task, k_att, k_ev, k_pending, k_outbox, k_counts, k_attention, k_dlq, k_stats,
    t[1], t[2], n,    t[3], d, ts)
end
return {'OK', ts, attempt_snapshot(k_att, n), state}
