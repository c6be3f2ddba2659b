-- mc_queue: applying the decision that follows a failure, pasted after common into fail and
-- reconcile_settle ("--@include decisions"). Defines no KEYS/ARGV of its own.

-- ----------------------------------------------------------------------------------- decisions

-- Apply the decision that follows a failed Attempt n, in the same script as the failure:
--   ''/'wait'  the task waits in failed for a person (retry_task);
--   'retry'    Attempt n+1 pending, due after delay_ms (task backoff, or pending when 0);
--   'stop'     the task is blocked and an attention item is recorded;
--   'quarantine' the task is dead-lettered with its history (and an attention item).
-- K needs done, held and topack (index_end). Returns the task's new state. Callers validate the decision's arguments before their first write.
local DECISIONS = {[''] = 'failed', wait = 'failed', retry = 'backoff', stop = 'blocked', quarantine = 'quarantined'}
local function decision_args()
  return {
    'decision', 'enum', '||wait|retry|stop|quarantine|', false,
    'why', 'text', 2000, false,
    'next_reason', 'text', 2000, false,
    'next_hypothesis', 'text', 2000, false,
    'delay_ms', 'int', 0, 365 * DAY_MS,
    'attention', 'json?', 262144, 'obj',
    'budget', 'enum', '||attempts|same_fingerprint|cost|tokens|wall_time|interruptions|cost_or_tokens|', false,
  }
end

-- A failure record as the Failure model reads it back: its class and fingerprint the ones the
-- script records beside it; nil when fine, else the E_BADARG reply.
local function failure_error(text, fclass, fingerprint)
  local fields = {failure_class = 'string', type = 'string', message = 'string', fingerprint = 'string',
                  retryable = 'boolean', traceback = 'string'}
  local f = cjson.decode(text)
  for k, v in pairs(f) do
    local want = fields[k]
    if not want or (type(v) ~= want and v ~= cjson.null) then
      return {'E_BADARG', 'failure: field ' .. tostring(k) .. ' is not part of a failure record, or has the wrong type'}
    end
  end
  if f.failure_class ~= fclass or f.fingerprint ~= fingerprint or type(f.type) ~= 'string' or f.type == '' then
    return {'E_BADARG', 'failure: its failure_class, fingerprint and type must be the ones recorded beside it'}
  end
  return nil
end

-- The decision's own consistency (after args() checked each field); nil when fine.
local function decision_error(A)
  if A.decision == 'retry' and chars(A.next_reason) < 10 then
    return {'E_BADARG', 'next_reason: a retry decision needs a reason of at least ten characters'}
  end
  if (A.decision == 'stop' or A.decision == 'quarantine') and A.attention == '' then
    return {'E_BADARG', 'attention: a stop or quarantine decision needs an attention item'}
  end
  return nil
end

local function apply_decision(K, task_id, queue, n, from_state, d, actor, ts)
  local state = DECISIONS[d.decision]
  if d.decision ~= '' and d.decision ~= 'wait' then
    redis.call('HINCRBY', K.stats, 'decision:' .. d.decision .. ':' .. (d.fclass or ''), 1)
  end
  if d.budget ~= '' then redis.call('HINCRBY', K.stats, 'budget_exhausted:' .. d.budget, 1) end
  if d.decision == 'retry' then
    local m = tonumber(n) + 1
    local due = ts + d.delay_ms
    if d.delay_ms <= 0 then state = 'pending' end
    local _, reason = chars(d.next_reason)
    aset(K.attempts, m, {'state', 'pending', 'created_at', ts, 'due_at', due, 'prev', n, 'reason', reason,
      'hypothesis', d.next_hypothesis, 'retry_by', actor})
    redis.call('HSET', K.task, 'state', state, 'attempts', m, 'active', m, 'updated_at', ts)
    redis.call('ZADD', K.pending, due, task_id)
    emit(K.events, 'attempt_created', {'attempt', m, 'retry_of', n, 'actor', actor, 'reason', reason,
      'hypothesis', d.next_hypothesis, 'due_at', due, 'delay_ms', d.delay_ms, 'decision', d.why})
  else
    redis.call('HSET', K.task, 'state', state, 'active', '', 'updated_at', ts)
    if d.decision == 'stop' or d.decision == 'quarantine' then
      redis.call('HSET', K.attention, task_id, d.attention)
      emit(K.events, 'attention_raised', {'attempt', n, 'actor', actor, 'reason', d.why, 'budget', d.budget})
    end
    if d.decision == 'quarantine' then
      redis.call('ZADD', K.dlq, ts, task_id)
      emit(K.events, 'task_quarantined', {'attempt', n, 'actor', actor, 'reason', d.why})
    end
  end
  move_count(K.counts, queue, from_state, state, K.task)
  index_end(K, task_id, from_state, state, ts)
  return state
end
