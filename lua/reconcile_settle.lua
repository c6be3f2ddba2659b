-- mc_queue: reconcile_settle
-- Settle a reconciling Attempt with the decision and the evidence it rests on: the Attempt becomes
-- succeeded or failed (terminal) and the task succeeded, failed or blocked (attention needed).
-- KEYS[1] counts     "<queue>|<state>" counters
-- KEYS[2] suspect    suspect index
-- KEYS[3] task       task hash
-- KEYS[4] attempts   attempts hash
-- KEYS[5] events     task event stream
-- ARGV[1] n               attempt number
-- ARGV[2] actor           reconciler id
-- ARGV[3] outcome         'succeeded' | 'failed'
-- ARGV[4] task_state      'succeeded' | 'failed' | 'blocked'
-- ARGV[5] result          result JSON when succeeded, else ''
-- ARGV[6] failure         failure JSON when failed, else ''
-- ARGV[7] fclass          failure class, or ''
-- ARGV[8] fingerprint     failure fingerprint, or ''
-- ARGV[9] evidence        evidence JSON the decision rests on
-- Returns: {'OK', ended_at, attempt_fields} | {'DUP', ended_at, attempt_fields} (already settled the same way)
--          {'E_STATE', attempt_state} | {'E_BADARG', why} | {'E_NOTASK', why}
-- Events: attempt_reconciled
-- Idempotent: yes
--@include common

local k_counts, k_suspect, k_task, k_att, k_ev = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local n, actor, outcome, task_state = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local result, failure, fclass, fingerprint, evidence = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]

local valid = {succeeded = {succeeded = true}, failed = {failed = true, blocked = true}}
if not valid[outcome] or not valid[outcome][task_state] then
  return {'E_BADARG', 'outcome ' .. outcome .. ' cannot leave the task ' .. task_state}
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
if outcome == 'succeeded' then
  aset(k_att, n, {'result', result})
  redis.call('HSET', k_task, 'result', result)
else
  aset(k_att, n, {'failure', failure, 'fclass', fclass, 'fingerprint', fingerprint})
end
redis.call('HSET', k_task, 'state', task_state, 'active', '', 'updated_at', ts)
redis.call('ZREM', k_suspect, t[1] .. '/' .. n)
move_count(k_counts, t[2], t[3], task_state)
emit(k_ev, 'attempt_reconciled', {'attempt', n, 'actor', actor, 'outcome', outcome, 'task_state', task_state,
  'failure_class', fclass, 'evidence', evidence})
return {'OK', ts, attempt_snapshot(k_att, n)}
