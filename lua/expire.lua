-- mc_queue: expire
-- A running Attempt whose lease key is gone (its PX ran out on Redis's clock) becomes suspect, not
-- failed: the task's fence is bumped so the old holder is refused from then on. Re-checks its own
-- condition, so two sweepers at once are safe. force=1 (recovery, or a cancel the executor did not
-- acknowledge in time) voids a live lease too. An index entry whose task or running Attempt is gone
-- is removed and logged (orphan_index_entry), so no sweep and no recovery stops on it.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] leases     lease expiry index
-- KEYS[5] suspect    suspect index
-- KEYS[6] task       task hash
-- KEYS[7] attempts   attempts hash
-- KEYS[8] events     task event stream
-- KEYS[9] cancels    running attempts with a cancel request
-- KEYS[10] stats     counters for metrics (refusals, expiries, decisions)
-- KEYS[11] fence     the task's fence counter
-- KEYS[12] lease     the task's lease key
-- KEYS[13] slotheld  concurrency slots held (the Attempt's return: slots_free)
-- KEYS[14] slotwait  Attempts waiting for a slot (the first of a returned slot's key is woken)
-- KEYS[15] slotwake  waiters to wake (slot_wake.lua)
-- KEYS[16] spent     spend ceilings' reservations and buckets (the Attempt's reservation replaced by its spend)
-- ARGV[1] member     the lease index member: "<task id>/<attempt number>"
-- ARGV[2] actor      who expires (sweeper id)
-- ARGV[3] force      '1' to void a live lease (recovery, unacknowledged cancel), else '0'
-- ARGV[4] reason     why, recorded in the event
-- ARGV[5] epoch      namespace epoch the caller knows (recover passes the one it is recovering to)
-- ARGV[6] holder     '' or the worker that must hold the lease: a worker voiding the lease of its own process
--                    that died leaves alone a lease another worker holds (a duplicate message's Attempt)
-- Returns: {'OK', new_fence, old_fence} | {'NOOP', why} (live lease, held by another worker, or an orphan
--          entry dropped)
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events: lease_expired | orphan_index_entry (nslog)
-- Idempotent: yes (re-checks; a second run is a NOOP)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], leases = KEYS[4], suspect = KEYS[5],
  task = KEYS[6], attempts = KEYS[7], events = KEYS[8], cancels = KEYS[9], stats = KEYS[10],
  fence = KEYS[11], lease = KEYS[12], slotheld = KEYS[13], slotwait = KEYS[14], slotwake = KEYS[15],
  spent = KEYS[16]}
bind_task(K)
local A, bad = args(ARGV, {
  'member', 'id', 200, false,
  'actor', 'text', 200, false,
  'force', 'enum', '|0|1|', false,
  'reason', 'text', 2000, false,
  'epoch', 'epoch', false, false,
  'holder', 'text', 200, false,
})
if bad then return bad end
local n = string.match(A.member, '/(%d+)$')
if not n or #n > 7 then return {'E_BADARG', "member must be '<task id>/<attempt number>'"} end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false,
  A.force == '1' and A.epoch or nil)
if err then return err end

local t = redis.call('HMGET', K.task, 'id', 'attempts', 'fence')
if t[1] and t[1] .. '/' .. n ~= A.member then return {'E_BADARG', 'member names another task than the keys'} end
if not t[1] then
  drop_orphan(K.cancels, K.nslog, A.member, 'no such task', A.actor)
  drop_orphan(K.leases, K.nslog, A.member, 'no such task', A.actor)
  return {'NOOP', 'no such task: index entry dropped'}
end
local a = redis.call('HMGET', K.attempts, n .. '.state', n .. '.lease_exp', n .. '.worker', n .. '.fence')
if a[1] ~= 'running' or t[2] ~= n then
  local why = 'attempt ' .. n .. ' is ' .. tostring(a[1]) .. ' (latest ' .. tostring(t[2]) .. ')'
  drop_orphan(K.cancels, K.nslog, A.member, why, A.actor)
  drop_orphan(K.leases, K.nslog, A.member, why, A.actor)
  return {'NOOP', why .. ': index entry dropped'}
end
if A.holder ~= '' and a[3] ~= A.holder then
  return {'NOOP', 'attempt ' .. n .. ' is held by ' .. tostring(a[3]) .. ', not ' .. A.holder}
end
if A.force ~= '1' and redis.call('GET', K.lease) == lease_value(n, a[4]) then
  return {'NOOP', 'lease is live for ' .. fmt(redis.call('PTTL', K.lease)) .. ' ms'}
end
local ts = now_ms()
local fence = next_fence(K.meta, K.fence, K.task, t[3])
redis.call('HSET', K.task, 'updated_at', ts)
aset(K.attempts, n, {'state', 'suspect', 'suspect_at', ts})
redis.call('DEL', K.lease)
local took = redis.call('HMGET', K.attempts, n .. '.slots', n .. '.slots_at', n .. '.spend', n .. '.cost',
  n .. '.tokens')  -- (what it holds: slots and reservations, returned below)
slots_free(K, n, A.member, ts, {took[1], took[2]})
if took[3] then spend_settle(K, n, A.member, ts, {took[3], took[4], took[5]}) end
redis.call('ZREM', K.leases, A.member)
redis.call('ZREM', K.cancels, A.member)
redis.call('ZADD', K.suspect, ts, A.member)
redis.call('HINCRBY', K.stats, A.force == '1' and 'lease_voided' or 'lease_expired', 1)
-- overdue_ms: how long after its expiry the lease was found; left_ms: what a voided live lease still had.
local late = ts - (tonumber(a[2]) or ts)
emit(K.events, 'lease_expired', {'attempt', n, 'actor', A.actor, 'worker', a[3], 'fence', a[4],
  'new_fence', fmt(fence), 'lease_exp', a[2], 'overdue_ms', fmt(math.max(0, late)),
  'left_ms', late < 0 and fmt(-late) or '', 'reason', A.reason})
return {'OK', fmt(fence), a[4]}
