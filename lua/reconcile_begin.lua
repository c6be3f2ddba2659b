-- mc_queue: reconcile_begin
-- A suspect Attempt enters reconciling: the platform now finds out what it did before deciding.
-- Re-entrant: an Attempt already reconciling (a reconciler died mid-way) is taken up again.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] task       task hash
-- KEYS[5] attempts   attempts hash
-- KEYS[6] events     task event stream
-- KEYS[7] stats      counters for metrics (refusals, expiries, decisions)
-- ARGV[1] n          attempt number
-- ARGV[2] actor      reconciler id
-- ARGV[3] epoch      namespace epoch the caller knows
-- Returns: {'OK', n} | {'DUP', n} (already reconciling) | {'E_STATE', attempt_state} | {'E_NOTASK', why}
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events: reconciling_started | reconcile_refused
-- Idempotent: yes
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], task = KEYS[4], attempts = KEYS[5],
  events = KEYS[6], stats = KEYS[7]}
bind_task(K)
local A, bad = args(ARGV, {
  'n', 'int', 1, MAX_N,
  'actor', 'text', 200, false,
  'epoch', 'epoch', false, false,
})
if bad then return bad end
local n = A.raw.n
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end
if redis.call('EXISTS', K.task) == 0 then return {'E_NOTASK', 'no such task'} end
local state = aget(K.attempts, n, 'state')
if state == 'reconciling' then return {'DUP', A.n} end
if state ~= 'suspect' then
  return refuse(K.events, K.stats, 'reconcile_refused', {'E_STATE', tostring(state)},
    {'attempt', n, 'actor', A.actor, 'reason', 'only a suspect attempt is reconciled', 'attempt_state', tostring(state)})
end
local ts = now_ms()
aset(K.attempts, n, {'state', 'reconciling', 'reconcile_started_at', ts, 'reconciler', A.actor})
emit(K.events, 'reconciling_started', {'attempt', n, 'actor', A.actor})
return {'OK', A.n}
