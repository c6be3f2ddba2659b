-- mc_queue: checkpoint
-- Record that a running Attempt reached a phase, with its data and the scope it is bound to
-- (task, attempt, execution digest, repository, base, branch, generation). Fenced like every
-- write, and monotonic: a phase at or before the Attempt's last one is refused.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] task       task hash
-- KEYS[5] attempts   attempts hash
-- KEYS[6] events     task event stream
-- KEYS[7] stats      counters for metrics (refusals, expiries, decisions)
-- KEYS[8] fence      the task's fence counter
-- KEYS[9] lease      the task's lease key
-- ARGV[1] n            attempt number
-- ARGV[2] fence        fence the caller holds
-- ARGV[3] worker       worker id
-- ARGV[4] phase        phase name
-- ARGV[5] phase_index  its position in the handler's declared phase order
-- ARGV[6] record       checkpoint JSON (phase, data, scope, scope_digest)
-- ARGV[7] digest       sha256 of the record
-- ARGV[8] epoch
-- ARGV[9] min_seq
-- ARGV[10] proof       claim sequence of the fence when the caller's client was issued it, or ''
-- Returns: {'OK', phase_index} | {'DUP', phase_index} (same phase, same record, same fence)
--          {'E_PHASE', last_phase, last_index} (not after the last phase)
--          {'E_STALE'|'E_STATE'|'E_EXPIRED', current_fence, attempt_state, lease_exp}
--          {'E_CANCELED', reason} (a cancel was requested: acknowledge instead)
--          {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_NONS', why} | {'E_BADARG', why}
-- Events: checkpoint_recorded | checkpoint_refused | stale_write_refused
-- Idempotent: yes (phase + record digest)
--@include common
--@include fenced

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], task = KEYS[4], attempts = KEYS[5],
  events = KEYS[6], stats = KEYS[7], fence = KEYS[8], lease = KEYS[9]}
bind_task(K)
local A, bad = args(ARGV, with({
  'n', 'int', 1, MAX_N,
  'fence', 'int', 0, MAX_INT,
  'worker', 'text', 200, false,
  'phase', 'id', 128, false,
  'phase_index', 'int', 0, 1000,
  'record', 'json', 1048576, 'obj',
  'digest', 'hex', 64, false,
}, fenced_args()))
if bad then return bad end
local n = A.raw.n
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, A.min_seq, A.worker, true)
if err then return err end
if aget(K.attempts, n, 'ckpt_digest.' .. A.phase) == A.digest and aget(K.attempts, n, 'fence') == A.raw.fence then
  return {'DUP', A.phase_index}
end
local ts
err, ts = fence_check(K, A, A.worker, A.digest, 'checkpoint', true)
if err then return err end
local last = tonumber(aget(K.attempts, n, 'phase_index') or '-1')
if A.phase_index <= last then
  local last_phase = aget(K.attempts, n, 'phase') or ''
  return refuse(K.events, K.stats, 'checkpoint_refused', {'E_PHASE', last_phase, fmt(last)},
    {'attempt', n, 'worker', A.worker, 'phase', A.phase, 'last_phase', last_phase,
     'reason', 'phases are monotonic within an attempt'})
end
aset(K.attempts, n, {'ckpt.' .. A.phase, A.record, 'ckpt_digest.' .. A.phase, A.digest, 'phase', A.phase,
  'phase_index', A.phase_index, 'phase_at', ts})
emit(K.events, 'checkpoint_recorded', {'attempt', n, 'worker', A.worker, 'fence', A.raw.fence, 'phase', A.phase,
  'digest', A.digest})
return {'OK', A.phase_index}
