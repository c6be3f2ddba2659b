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
-- ARGV[1] n            attempt number
-- ARGV[2] fence        fence the caller holds
-- ARGV[3] worker       worker id
-- ARGV[4] phase        phase name
-- ARGV[5] phase_index  its position in the handler's declared phase order
-- ARGV[6] record       checkpoint JSON (phase, data, scope, scope_digest)
-- ARGV[7] digest       sha256 of the record
-- ARGV[8] epoch
-- ARGV[9] min_seq
-- Returns: {'OK', phase_index} | {'DUP', phase_index} (same phase, same record)
--          {'E_PHASE', last_phase, last_index} (not after the last phase)
--          {'E_STALE'|'E_STATE'|'E_EXPIRED', current_fence, attempt_state, lease_exp}
--          {'E_CANCELED', reason} (a cancel was requested: acknowledge instead)
--          {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_BADARG', why}
-- Events: checkpoint_recorded | checkpoint_refused | stale_write_refused
-- Idempotent: yes (phase + record digest)
--@include common

local k_meta, k_epochs, k_nslog, k_task, k_att, k_ev = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local k_stats = KEYS[7]
local n, fence, worker, phase = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local phase_index, record, digest = tonumber(ARGV[5]), ARGV[6], ARGV[7]
local epoch, min_seq = ARGV[8], ARGV[9]

if not phase_index or phase_index < 0 or phase == '' then
  return {'E_BADARG', 'phase and a phase index >= 0 are required'}
end
if aget(k_att, n, 'ckpt_digest.' .. phase) == digest and aget(k_att, n, 'fence') == fence then
  return {'DUP', phase_index}
end
local err = ns_check(k_meta, k_epochs, k_nslog, epoch, min_seq, worker, true)
if err then return err end
local ts = now_ms()
err = fence_check(k_meta, k_nslog, k_stats, k_task, k_att, k_ev, n, fence, worker, digest, 'checkpoint', ts)
if err then return err end
err = cancel_check(k_task, k_ev, n, worker, digest, 'checkpoint')
if err then return err end
local last = tonumber(aget(k_att, n, 'phase_index') or '-1')
if phase_index <= last then
  local last_phase = aget(k_att, n, 'phase') or ''
  emit(k_ev, 'checkpoint_refused', {'attempt', n, 'worker', worker, 'phase', phase, 'last_phase', last_phase,
    'reason', 'phases are monotonic within an attempt'})
  return {'E_PHASE', last_phase, fmt(last)}
end
aset(k_att, n, {'ckpt.' .. phase, record, 'ckpt_digest.' .. phase, digest, 'phase', phase,
  'phase_index', phase_index, 'phase_at', ts})
emit(k_ev, 'checkpoint_recorded', {'attempt', n, 'worker', worker, 'fence', fence, 'phase', phase,
  'digest', digest})
return {'OK', phase_index}
