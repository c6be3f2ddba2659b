-- mc_queue: dlq_purge
-- Delete a quarantined task and its whole history, for good (an operator's explicit act; the
-- namespace log keeps a line saying who purged what and why). A tombstone stays for the retention
-- window the operator chose: the task id (a key with that TTL) and the producer's idempotency key
-- (its entry marked purged until then) are refused by enqueue, so the same work never runs again.
-- The namespace fence floor is raised to the task's last fence and its fence counter deleted (as
-- retire.lua does): the same task id enqueued again after the window gets fences above every fence
-- the purged incarnation issued, and a zombie of that one is refused as stale ('fence_retired').
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] counts     "<queue>|<state>" counters
-- KEYS[5] idem       producer idempotency keys
-- KEYS[6] dlq        quarantined tasks
-- KEYS[7] attention  attention items
-- KEYS[8] task       task hash
-- KEYS[9] attempts   attempts hash
-- KEYS[10] events    task event stream
-- KEYS[11] effects   the task's effects
-- KEYS[12] tomb      the task's tombstone as versions before 2026-12 kept it (deleted)
-- KEYS[13] stats     counters for metrics (refusals, expiries, decisions)
-- KEYS[14] held      the queue's tasks waiting for a person
-- KEYS[15] idem_until retired producer keys -> when their entry may go (ms)
-- KEYS[16] fence     the task's fence counter (deleted; the namespace floor keeps its value)
-- KEYS[17] tombs0    the tombstone buckets this task id's tombstone may be in (common.lua tomb_level)
-- KEYS[18] tombs1
-- KEYS[19] tombs2
-- ARGV[1] actor
-- ARGV[2] reason       why its history may go (>= 10 characters)
-- ARGV[3] tombstone_ms how long enqueue refuses the task id and its producer key (0: not at all)
-- ARGV[4] request_id   a resend with the same id reports the same purge
-- ARGV[5] epoch
-- Returns: {'OK', attempts} | {'DUP', attempts} | {'E_STATE', task_state} | {'E_NOTASK', why}
--          {'E_CHANGED', why} (tasks wait for it and the sweeper has not released them yet)
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events: task_purged (nslog) | purge_refused
-- Idempotent: by request id
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], counts = KEYS[4], idem = KEYS[5],
  dlq = KEYS[6], attention = KEYS[7], task = KEYS[8], attempts = KEYS[9], events = KEYS[10],
  effects = KEYS[11], tomb = KEYS[12], stats = KEYS[13], held = KEYS[14], idem_until = KEYS[15], fence = KEYS[16],
  tombs0 = KEYS[17], tombs1 = KEYS[18], tombs2 = KEYS[19]}
bind_task(K)
local A, bad = args(ARGV, {
  'actor', 'id', 200, false,
  'reason', 'text', 2000, false,
  'tombstone_ms', 'int', 0, 3650 * DAY_MS,
  'request_id', 'reqid', false, false,
  'epoch', 'epoch', false, false,
})
if bad then return bad end
local count, reason = chars(A.reason)
if count < 10 then return {'E_BADARG', 'reason: a purge needs a reason of at least ten characters'} end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end
local t = redis.call('HMGET', K.task, 'id', 'queue', 'state', 'attempts', 'idem_key', 'payload_digest', 'handler',
  'dependents', 'released_at')
if not t[1] then
  local tomb = tomb_get(K.tombs0, K.tombs1, K.tombs2, K.tomb, string.match(K.task, ':t:(.+)$') or '')
  if tomb and A.request_id ~= '' and tomb.request_id == A.request_id then return {'DUP', tomb.attempts} end
  return {'E_NOTASK', 'no such task'}
end
if t[3] ~= 'quarantined' then
  return refuse(K.events, K.stats, 'purge_refused', {'E_STATE', t[3]},
    {'actor', A.actor, 'reason', 'only a quarantined task is purged; this one is ' .. t[3]})
end
if t[8] and not t[9] then  -- its end's obligation to them is not carried out yet (release.lua)
  return {'E_CHANGED', 'tasks wait for it and the sweeper has not released them yet: purge it again in a moment'}
end
local ts = now_ms()
local until_ms = ts + A.tombstone_ms
local fence = tonumber(fence_of(K.task, K.fence)) or 0
local floor = tonumber(redis.call('HGET', K.meta, 'floor') or '0') or 0
if fence > floor then redis.call('HSET', K.meta, 'floor', fmt(fence)) end
redis.call('DEL', K.task, K.attempts, K.events, K.effects, K.fence, K.tomb)
redis.call('ZREM', K.dlq, t[1])
redis.call('ZREM', K.held, t[1])
redis.call('HDEL', K.attention, t[1])
if t[5] and t[5] ~= '' then
  if A.tombstone_ms > 0 then
    redis.call('HSET', K.idem, t[5], t[1] .. ' ' .. task_sig(K.idem, t[5], t[1], t[6], t[7]) .. ' purged ' .. fmt(until_ms))
    redis.call('ZADD', K.idem_until, until_ms, t[5])
  else
    redis.call('HDEL', K.idem, t[5])
  end
end
-- The tombstone lives at least a minute even with no retention window, so that a resent purge is
-- recognised; enqueue refuses the task id only until until_ms.
tomb_put(K.tombs0, K.tombs1, K.tombs2, t[1], until_ms, tonumber(t[4]) or 0, 'quarantined', fence, t[5] or '', A.request_id,
  cjson.encode({kind = 'purged', actor = A.actor, reason = reason, window_ms = A.tombstone_ms}),
  ts + math.max(A.tombstone_ms, 60000))
move_count(K.counts, t[2], 'quarantined', '', K.task)
emit(K.nslog, 'task_purged', {'task', t[1], 'actor', A.actor, 'reason', reason, 'attempts', t[4],
  'idem_key', t[5] or '', 'tombstone_until', A.tombstone_ms > 0 and fmt(until_ms) or ''})
return {'OK', tonumber(t[4])}
