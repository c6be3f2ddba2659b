-- mc_queue: effect_done
-- Record the provider's receipt (its identity for what it did) for an effect whose intent is on
-- file. By the worker holding the current fence (source 'perform' or 'reconcile'), or by the
-- reconciler while the Attempt is reconciling (fence ''). 'absent': the provider has nothing (safe to
-- redo); 'unknown' (reconciler only): the provider cannot tell. The namespace and the fence are
-- checked before anything else, a receipt already on file included.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] task       task hash
-- KEYS[5] attempts   attempts hash
-- KEYS[6] events     task event stream
-- KEYS[7] effects    the task's effects (key -> record JSON)
-- KEYS[8] stats      counters for metrics (refusals, expiries, decisions)
-- KEYS[9] fence      the task's fence counter
-- KEYS[10] lease     the task's lease key
-- ARGV[1] n          attempt number
-- ARGV[2] fence      fence the worker holds, or '' for the reconciler
-- ARGV[3] actor      worker or reconciler id
-- ARGV[4] key        operation key
-- ARGV[5] outcome    'done' | 'absent' | 'unknown'
-- ARGV[6] receipt    canonical receipt JSON ('done'), or a note
-- ARGV[7] source     'perform' | 'reconcile'
-- ARGV[8] epoch
-- ARGV[9] min_seq
-- ARGV[10] proof     claim sequence of the fence when the caller's client was issued it, or ''
-- Returns: {'OK', record} | {'DUP', record} (same receipt on file) | {'E_CONFLICT', record} (another receipt)
--          {'E_NOEFFECT', why} | {'E_STATE', attempt_state}
--          {'E_STALE'|'E_EXPIRED', current_fence, attempt_state, lease_exp}
--          {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events: effect_receipt | effect_absent | effect_unknown | effect_conflict | effect_refused | late_receipt
--         | stale_write_refused
-- Idempotent: yes (the same receipt again is a DUP)
--@include common
--@include fenced

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], task = KEYS[4], attempts = KEYS[5],
  events = KEYS[6], effects = KEYS[7], stats = KEYS[8], fence = KEYS[9], lease = KEYS[10]}
bind_task(K)
local A, bad = args(ARGV, with({
  'n', 'int', 1, MAX_N,
  'fence', 'int?', 0, MAX_INT,
  'actor', 'text', 200, false,
  'key', 'id', 512, false,
  'outcome', 'enum', '|done|absent|unknown|', false,
  'receipt', 'text', 65536, false,
  'source', 'enum', '|perform|reconcile|', false,
}, fenced_args()))
if bad then return bad end
if A.outcome == 'done' then
  local _, why = check_arg(A.receipt, 'json', 65536, false)
  if why then return {'E_BADARG', 'receipt ' .. why} end
end
if A.fence and A.outcome == 'unknown' then
  return {'E_BADARG', 'outcome: a worker that cannot tell raises; it records no unknown'}
end
local n = A.raw.n
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, A.min_seq, A.actor, A.fence ~= nil)
if err then return err end
local ts
if A.fence then
  err, ts = fence_check(K, A, A.actor, A.key, 'effect_done', false)
  if err then
    -- The provider's receipt is evidence even when its sender lost authority: keep it in the history.
    if err[1] ~= 'E_NOTASK' and err[1] ~= 'E_NSLOST' then
      emit_task(K.events, 'late_receipt', {'attempt', n, 'worker', A.actor, 'key', A.key, 'receipt', A.receipt})
    end
    return err
  end
else
  if redis.call('EXISTS', K.task) == 0 then return {'E_NOTASK', 'no such task'} end
  local state = aget(K.attempts, n, 'state')
  if state ~= 'reconciling' then
    return refuse(K.events, K.stats, 'effect_refused', {'E_STATE', tostring(state)},
      {'attempt', n, 'actor', A.actor, 'key', A.key, 'reason', 'the reconciler records only while the attempt is reconciling',
       'attempt_state', tostring(state)})
  end
  ts = now_ms()
end
local existing = redis.call('HGET', K.effects, A.key)
if not existing then
  return refuse(K.events, K.stats, 'effect_refused', {'E_NOEFFECT', 'no intent on file for ' .. A.key},
    {'attempt', n, 'actor', A.actor, 'key', A.key, 'reason', 'no intent on file'})
end
local rec = cjson.decode(existing)
if rec.state == 'done' then
  if A.outcome == 'done' and A.receipt ~= rec.receipt_json then
    return refuse(K.events, K.stats, 'effect_conflict', {'E_CONFLICT', existing},
      {'attempt', n, 'actor', A.actor, 'key', A.key, 'receipt', A.receipt})
  end
  return {'DUP', existing}
end
rec.state = A.outcome
if A.outcome == 'done' then rec.receipt_json = A.receipt else rec.note = A.receipt end
rec.receipt_at = ts
rec.settled_by = A.actor
rec.source = A.source
rec.receipt_attempt = A.n
local text = cjson.encode(rec)
redis.call('HSET', K.effects, A.key, text)
if A.outcome == 'done' then
  emit(K.events, 'effect_receipt', {'attempt', n, 'actor', A.actor, 'key', A.key, 'source', A.source, 'receipt', A.receipt})
elseif A.outcome == 'absent' then
  emit(K.events, 'effect_absent', {'attempt', n, 'actor', A.actor, 'key', A.key, 'source', A.source, 'note', A.receipt})
else
  emit(K.events, 'effect_unknown', {'attempt', n, 'actor', A.actor, 'key', A.key, 'source', A.source, 'note', A.receipt})
end
return {'OK', text}
