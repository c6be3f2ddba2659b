-- mc_queue: mark_dispatched
-- After an Attempt was handed to the transport (an RQ job), or found still waiting there, record it:
-- its dispatch count and the time (dispatched_at). The sweeper walks each queue's pending index and
-- sends again the Attempts nobody claimed within its recheck time of that dispatch (same job id: a
-- duplicate message is refused by the claim, never run twice). An Attempt that is no longer pending
-- (or whose task is gone) is left alone. Versions before 2026-12 kept a dispatch schedule of its own
-- (the outbox): its entry for the Attempt is dropped here, so that it drains.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] outbox     the old dispatch schedule (drained)
-- KEYS[5] task       task hash
-- KEYS[6] attempts   attempts hash of the task
-- ARGV[1] member     the Attempt: "<task id>/<attempt number>"
-- ARGV[2] recheck_ms a dispatch: when it is due to be looked at again if nobody claimed it (reported); '' with
--                    resend_ms (exactly one of the two is given)
-- ARGV[3] actor
-- ARGV[4] epoch
-- ARGV[5] resend_ms  '' (a dispatch), or: no dispatch happened, the Attempt is to be sent again this long from now
--                    rather than a whole recheck after its last dispatch (a worker refused its message for a
--                    failing health probe: another worker, or this one once its probe passes, may take it).
--                    Kept as '<n>.resend_at'; the sweeper's dispatch walk sends it once that time has come,
--                    unless a dispatch came after it (Schedule.dispatch_walk). Nothing else is written.
-- An Attempt not due yet (a rate limit deferred its claim meanwhile) counts the dispatch but keeps no
-- dispatched_at: the sweeper sends it when it comes due.
-- Returns: {'OK', recheck_at (resend_ms: resend_at)} | {'NOOP', why} (claimed meanwhile, not pending any more, not due yet, or no
--          such task)
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events: orphan_index_entry (nslog, an old schedule's entry naming no task)
-- Idempotent: yes (a resend counts one more dispatch: a count, never a state)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], outbox = KEYS[4], task = KEYS[5],
  attempts = KEYS[6]}
K.attempts = attempts_of(K.task, K.attempts)  -- (no history: bind_task's other half)
local A, bad = args(ARGV, {
  'member', 'id', 200, false,
  'recheck_ms', 'int?', 1, DAY_MS,
  'actor', 'text', 200, false,
  'epoch', 'epoch', false, false,
  'resend_ms', 'int?', 1, DAY_MS,
})
if bad then return bad end
if (A.recheck_ms == nil) == (A.resend_ms == nil) then
  return {'E_BADARG', 'recheck_ms (a dispatch) or resend_ms (a resend), exactly one of them'}
end
local n = string.match(A.member, '/(%d+)$')
if not n or #n > 7 then return {'E_BADARG', "member must be '<task id>/<attempt number>'"} end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end
local id = redis.call('HGET', K.task, 'id')
if id and id .. '/' .. n ~= A.member then return {'E_BADARG', 'member names another task than the keys'} end
local old = redis.call('ZSCORE', K.outbox, A.member)
if not id then
  if old then drop_orphan(K.outbox, K.nslog, A.member, 'no such task', A.actor) end
  return {'NOOP', 'no such task'}
end
if old then redis.call('ZREM', K.outbox, A.member) end
local state = aget(K.attempts, n, 'state')
if state ~= 'pending' then return {'NOOP', 'attempt is ' .. tostring(state)} end
local ts = now_ms()
if A.resend_ms then
  aset(K.attempts, n, {'resend_at', ts + A.resend_ms})
  return {'OK', fmt(ts + A.resend_ms)}
end
local due = tonumber(aget(K.attempts, n, 'due_at') or '0') or 0
redis.call('HINCRBY', K.attempts, n .. '.dispatches', 1)
-- Not due yet (a claim deferred it for a rate limit while this send was on its way): no dispatch on file,
-- so the sweeper sends it again when it comes due (Schedule.came_due looks only at undispatched ones).
if due > ts then return {'NOOP', 'attempt ' .. n .. ' is not due for ' .. fmt(due - ts) .. ' ms'} end
aset(K.attempts, n, {'dispatched_at', ts})
return {'OK', math.max(ts, due) + A.recheck_ms}
