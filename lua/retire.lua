-- mc_queue: retire
-- Delete a task that retention (the sweeper) or an operator's purge lets go: every key of the task and
-- every index entry naming it, in one step. Only a task in one of the states the caller names, all of
-- them states with no Attempt that may still run (succeeded, canceled, failed, blocked, quarantined);
-- and, when the caller read it from the done or held index, only if its entry there still has the
-- score that was read (a task retried and failed again since is not deleted on old grounds).
-- A tombstone stays for the idempotency window: enqueue refuses the task id, and the producer key's
-- entry is marked retired until then (the same work does not run again within the window; the
-- sweeper drops the entry after it, idem_trim.lua). The namespace fence floor is raised to the
-- task's last fence, so the same task id enqueued again later gets fences above every fence its
-- earlier incarnation issued: a zombie of that one holds a stale fence, never a current one.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] counts     "<queue>|<state>" counters
-- KEYS[5] idem       producer idempotency keys
-- KEYS[6] idem_until retired producer keys -> when their entry may go (ms)
-- KEYS[7] dlq        quarantined tasks
-- KEYS[8] attention  attention items
-- KEYS[9] done       the queue's finished tasks
-- KEYS[10] held      the queue's tasks waiting for a person
-- KEYS[11] topack    finished tasks whose history the sweeper packs
-- KEYS[12] task      task hash
-- KEYS[13] attempts  attempts hash
-- KEYS[14] events    task event stream
-- KEYS[15] effects   the task's effects
-- KEYS[16] fence     the task's fence counter
-- KEYS[17] tomb      the task's tombstone as versions before 2026-12 kept it (deleted)
-- KEYS[18] tombs0    the tombstone buckets this task id's tombstone may be in (common.lua tomb_level)
-- KEYS[19] tombs1
-- KEYS[20] tombs2
-- ARGV[1] states       the states the caller lets go, as '|succeeded|canceled|'
-- ARGV[2] score        the task's score in its done/held index when read, or '' (an operator's purge)
-- ARGV[3] actor
-- ARGV[4] reason       why it goes (>= 10 characters), kept in the tombstone
-- ARGV[5] tombstone_ms how long enqueue refuses the task id and its producer key (0: not at all)
-- ARGV[6] log          'task': one namespace log event for this task (a purge); '': none (retention logs
--                      one line per sweeper pass)
-- ARGV[7] epoch
-- ARGV[8] seen         '' or the task's version as the archive read it: '<updated_at> <last event id>
--                      <Attempt fields> <effects>' (a packed task: '<updated_at> 0-0 0 0'); the task is
--                      deleted only if it is still that version, so nothing recorded after the archive's
--                      read (a refused stale write's event) is deleted unarchived
-- Returns: {'OK', state, attempts} | {'NOOP', why} (no such task, its index entry or, with seen, the task
--          changed since read, or tasks wait for it that the sweeper has not released yet)
--          {'E_STATE', task_state} | {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events: task_retired (nslog, when log is 'task') | retire_refused
-- Idempotent: yes (a retired task is gone: NOOP)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], counts = KEYS[4], idem = KEYS[5],
  idem_until = KEYS[6], dlq = KEYS[7], attention = KEYS[8], done = KEYS[9], held = KEYS[10], topack = KEYS[11],
  task = KEYS[12], attempts = KEYS[13], events = KEYS[14], effects = KEYS[15], fence = KEYS[16], tomb = KEYS[17],
  tombs0 = KEYS[18], tombs1 = KEYS[19], tombs2 = KEYS[20]}
bind_task(K)
local A, bad = args(ARGV, {
  'states', 'text', 64, false,
  'score', 'int?', 0, MAX_INT,
  'actor', 'id', 200, false,
  'reason', 'text', 2000, false,
  'tombstone_ms', 'int', 0, 3650 * DAY_MS,
  'log', 'enum', '||task|', false,
  'epoch', 'epoch', false, false,
  'seen', 'text', 120, false,
})
if bad then return bad end
if A.seen ~= '' and not string.find(A.seen, '^%d+ %d+%-%d+ %d+ %d+$') then
  return {'E_BADARG', "seen must be '' or '<updated_at> <last event id> <attempt fields> <effects>'"}
end
local letgo = {}
for s in string.gmatch(A.states, '[^|]+') do
  if not (HELD[s] or DONE[s]) then
    return {'E_BADARG', 'states: ' .. s .. ' is not a state a task ends or waits in (succeeded, canceled, failed, '
      .. 'blocked, quarantined)'}
  end
  letgo[s] = true
end
if not next(letgo) then return {'E_BADARG', "states: name at least one state, as '|succeeded|'"} end
local count, reason = chars(A.reason)
if count < 10 then return {'E_BADARG', 'reason: a retirement needs a reason of at least ten characters'} end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end
local t = redis.call('HMGET', K.task, 'id', 'queue', 'state', 'attempts', 'idem_key', 'payload_digest', 'handler',
  'active', 'dependents', 'released_at')
if not t[1] then return {'NOOP', 'no such task'} end
if t[9] and not t[10] then  -- its end's obligation to them is not carried out yet (release.lua)
  return {'NOOP', 'tasks wait for it and the sweeper has not released them yet: retire it after'}
end
if not letgo[t[3]] or (t[8] and t[8] ~= '') then
  return refuse(K.events, nil, 'retire_refused', {'E_STATE', t[3]},
    {'actor', A.actor, 'reason', 'the task is ' .. t[3] .. ', not one of ' .. A.states .. ' with nothing running'})
end
if A.score then
  local score
  if HELD[t[3]] then score = redis.call('ZSCORE', K.held, t[1]) else score = redis.call('ZSCORE', K.done, t[1]) end
  if tonumber(score or '-1') ~= A.score then
    return {'NOOP', 'its index entry changed since it was read'}
  end
end
if A.seen ~= '' then
  local now_seen = (redis.call('HGET', K.task, 'updated_at') or '0') .. ' ' .. last_event_id(K.events) ..
    ' ' .. redis.call('HLEN', K.attempts) .. ' ' .. redis.call('HLEN', K.effects)
  if now_seen ~= A.seen then
    return {'NOOP', 'the task changed since the archive read it (now ' .. now_seen .. '): read it again'}
  end
end
local idem_key = t[5]
local ts = now_ms()
local until_ms = ts + A.tombstone_ms
local fence = tonumber(fence_of(K.task, K.fence)) or 0
local floor = tonumber(redis.call('HGET', K.meta, 'floor') or '0') or 0
if fence > floor then redis.call('HSET', K.meta, 'floor', fmt(fence)) end
redis.call('DEL', K.task, K.attempts, K.events, K.effects, K.fence, K.tomb)
redis.call('ZREM', K.done, t[1])
redis.call('ZREM', K.held, t[1])
redis.call('ZREM', K.topack, t[1])
redis.call('ZREM', K.dlq, t[1])
redis.call('HDEL', K.attention, t[1])
if idem_key and idem_key ~= '' then
  if A.tombstone_ms > 0 then
    redis.call('HSET', K.idem, idem_key, t[1] .. ' ' .. task_sig(K.idem, idem_key, t[1], t[6], t[7]) .. ' purged ' ..
      fmt(until_ms))
    redis.call('ZADD', K.idem_until, until_ms, idem_key)
  else
    redis.call('HDEL', K.idem, idem_key)
  end
end
if A.tombstone_ms > 0 then
  tomb_put(K.tombs0, K.tombs1, K.tombs2, t[1], until_ms, tonumber(t[4]) or 0, t[3], fence, idem_key or '', '',
    cjson.encode({kind = 'retired', actor = A.actor, reason = reason, window_ms = A.tombstone_ms}), until_ms)
end
move_count(K.counts, t[2], t[3], '', K.task)
if A.log == 'task' then
  emit(K.nslog, 'task_retired', {'task', t[1], 'state', t[3], 'actor', A.actor, 'reason', reason, 'attempts', t[4],
    'idem_key', idem_key or '', 'tombstone_until', A.tombstone_ms > 0 and fmt(until_ms) or ''})
end
return {'OK', t[3], tonumber(t[4])}
