-- mc_queue: index_drop
-- Remove an index entry that names no task, an unreadable member, or an Attempt that is not in the
-- state the index is for, and say so in the namespace log (orphan_index_entry). Re-checks: an entry
-- that is still right is refused, never dropped. The sweeper and recovery use it so that one bad
-- entry never stops a batch.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] index      the index holding the entry
-- KEYS[5] task       task hash of the member ({prefix}:t:- when the member names no task)
-- KEYS[6] attempts   attempts hash of the member
-- ARGV[1] kind       which index: 'leases' | 'suspect' | 'outbox' | 'cancels'
-- ARGV[2] member     the entry
-- ARGV[3] actor
-- ARGV[4] reason     what the caller saw, recorded
-- ARGV[5] epoch      namespace epoch the caller knows (recover passes the one it is recovering to)
-- Returns: {'OK'} (dropped) | {'NOOP', why} (not in the index) | {'E_STATE', attempt_state} (the entry is right)
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events (nslog): orphan_index_entry
-- Idempotent: yes (a second run finds nothing to drop)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], index = KEYS[4], task = KEYS[5],
  attempts = KEYS[6]}
K.attempts = attempts_of(K.task, K.attempts)  -- (no history: bind_task's other half)
local A, bad = args(ARGV, {
  'kind', 'enum', '|leases|suspect|outbox|cancels|', false,
  'member', 'raw', 1000, false,
  'actor', 'text', 200, false,
  'reason', 'text', 2000, false,
  'epoch', 'epoch', false, false,
})
if bad then return bad end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false, A.epoch)
if err then return err end
if not redis.call('ZSCORE', K.index, A.member) then return {'NOOP', 'not in the index'} end
local n = string.match(A.member, '/(%d+)$')
local t = redis.call('HMGET', K.task, 'id', 'attempts', 'cancel_requested')
if n and t[1] and t[1] .. '/' .. n == A.member then
  local state = aget(K.attempts, n, 'state')
  local right = (A.kind == 'leases' and state == 'running' and t[2] == n)
    or (A.kind == 'cancels' and state == 'running' and t[2] == n and t[3] ~= nil)
    or (A.kind == 'suspect' and (state == 'suspect' or state == 'reconciling'))
    or (A.kind == 'outbox' and state == 'pending' and t[2] == n)
  if right then return {'E_STATE', tostring(state)} end
end
drop_orphan(K.index, K.nslog, A.member, A.reason, A.actor)
return {'OK'}
