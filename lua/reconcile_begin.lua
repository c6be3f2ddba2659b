-- mc_queue: reconcile_begin
-- A suspect Attempt enters reconciling: the platform now finds out what it did before deciding.
-- Re-entrant: an Attempt already reconciling (a reconciler died mid-way) is taken up again.
-- KEYS[1] task       task hash
-- KEYS[2] attempts   attempts hash
-- KEYS[3] events     task event stream
-- ARGV[1] n          attempt number
-- ARGV[2] actor      reconciler id
-- Returns: {'OK', n} | {'DUP', n} (already reconciling) | {'E_STATE', attempt_state} | {'E_NOTASK', why}
-- Events: reconciling_started
-- Idempotent: yes
--@include common

local k_task, k_att, k_ev = KEYS[1], KEYS[2], KEYS[3]
local n, actor = ARGV[1], ARGV[2]
if redis.call('EXISTS', k_task) == 0 then return {'E_NOTASK', 'no such task'} end
local state = aget(k_att, n, 'state')
if state == 'reconciling' then return {'DUP', tonumber(n)} end
if state ~= 'suspect' then return {'E_STATE', tostring(state)} end
local ts = now_ms()
aset(k_att, n, {'state', 'reconciling', 'reconcile_started_at', ts, 'reconciler', actor})
emit(k_ev, 'reconciling_started', {'attempt', n, 'actor', actor})
return {'OK', tonumber(n)}
