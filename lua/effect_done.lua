-- mc_queue: effect_done
-- Record the provider's receipt (its identity for what it did) for an effect whose intent is on
-- file. By the worker holding the current fence (source 'perform' or 'reconcile'), or by the
-- reconciler while the Attempt is reconciling (fence ''). 'absent': the provider has nothing (safe to
-- redo); 'unknown' (reconciler only): the provider cannot tell.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] task       task hash
-- KEYS[5] attempts   attempts hash
-- KEYS[6] events     task event stream
-- KEYS[7] effects    the task's effects (key -> record JSON)
-- KEYS[8] stats      counters for metrics (refusals, expiries, decisions)
-- ARGV[1] n          attempt number
-- ARGV[2] fence      fence the worker holds, or '' for the reconciler
-- ARGV[3] actor      worker or reconciler id
-- ARGV[4] key        operation key
-- ARGV[5] outcome    'done' | 'absent' | 'unknown'
-- ARGV[6] receipt    canonical receipt JSON ('done'), or a note
-- ARGV[7] source     'perform' | 'reconcile'
-- ARGV[8] epoch
-- ARGV[9] min_seq
-- Returns: {'OK', record} | {'DUP', record} (same receipt on file) | {'E_CONFLICT', record} (another receipt)
--          {'E_NOEFFECT', why} | {'E_STATE', attempt_state}
--          {'E_STALE'|'E_EXPIRED', current_fence, attempt_state, lease_exp}
--          {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_BADARG', why}
-- Events: effect_receipt | effect_absent | effect_unknown | effect_conflict | late_receipt | stale_write_refused
-- Idempotent: yes (the same receipt again is a DUP)
--@include common

local k_meta, k_epochs, k_nslog, k_task = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local k_att, k_ev, k_effects = KEYS[5], KEYS[6], KEYS[7]
local k_stats = KEYS[8]
local n, fence, actor, key, outcome, receipt, source = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local epoch, min_seq = ARGV[8], ARGV[9]

if outcome ~= 'done' and outcome ~= 'absent' and outcome ~= 'unknown' then
  return {'E_BADARG', 'outcome must be done, absent or unknown'}
end
if fence ~= '' and outcome == 'unknown' then return {'E_BADARG', 'a worker that cannot tell raises; it records no unknown'} end
local existing = redis.call('HGET', k_effects, key)
if not existing then return {'E_NOEFFECT', 'no intent on file for ' .. key} end
local rec = cjson.decode(existing)
if rec.state == 'done' then
  if outcome == 'done' and receipt == rec.receipt_json then
    return {'DUP', existing}
  end
  if outcome == 'done' then
    emit(k_ev, 'effect_conflict', {'attempt', n, 'actor', actor, 'key', key, 'receipt', receipt})
    return {'E_CONFLICT', existing}
  end
  return {'DUP', existing}
end
local ts = now_ms()
if fence ~= '' then
  local err = ns_check(k_meta, k_epochs, k_nslog, epoch, min_seq, actor, true)
  if err then return err end
  err = fence_check(k_meta, k_nslog, k_stats, k_task, k_att, k_ev, n, fence, actor, key, 'effect_done', ts)
  if err then
    -- The provider's receipt is evidence even when its sender lost authority: keep it in the history.
    emit(k_ev, 'late_receipt', {'attempt', n, 'worker', actor, 'key', key, 'receipt', receipt})
    return err
  end
else
  local state = aget(k_att, n, 'state')
  if state ~= 'reconciling' then return {'E_STATE', tostring(state)} end
end
rec.state = outcome
if outcome == 'done' then rec.receipt_json = receipt else rec.note = receipt end
rec.receipt_at = ts
rec.settled_by = actor
rec.source = source
rec.receipt_attempt = tonumber(n)
local text = cjson.encode(rec)
redis.call('HSET', k_effects, key, text)
if outcome == 'done' then
  emit(k_ev, 'effect_receipt', {'attempt', n, 'actor', actor, 'key', key, 'source', source, 'receipt', receipt})
elseif outcome == 'absent' then
  emit(k_ev, 'effect_absent', {'attempt', n, 'actor', actor, 'key', key, 'source', source, 'note', receipt})
else
  emit(k_ev, 'effect_unknown', {'attempt', n, 'actor', actor, 'key', key, 'source', source, 'note', receipt})
end
return {'OK', text}
