-- mc_queue: enqueue
-- Create a Task and its first Attempt (pending, claimable now, or at its due time: a delay or run_at
-- makes the task 'scheduled' until then, the due time computed and compared on Redis's clock). The
-- first dispatch exists only because there is no prior Attempt. Idempotent on the producer's key and on the task id; a key or
-- id whose task was purged is refused until its tombstone's retention window has passed.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] idem       producer idempotency key -> "<task id> <digest>|<handler>[ purged <until ms>]"
-- KEYS[5] queues     set of queue names
-- KEYS[6] counts     "<queue>|<state>" counters
-- KEYS[7] task       task hash
-- KEYS[8] attempts   attempts hash
-- KEYS[9] events     task event stream
-- KEYS[10] pending   the queue's pending index
-- KEYS[11] tomb      tombstone of this task id as versions before 2026-12 kept it (still read)
-- KEYS[12] tombs0    the tombstone buckets this task id's tombstone may be in (common.lua tomb_level)
-- KEYS[13] tombs1
-- KEYS[14] tombs2
-- KEYS[15] deadlines the queue's deadline index (task id -> its next deadline, ms): only a task with one
-- ARGV[1] task_id
-- ARGV[2] queue
-- ARGV[3] handler
-- ARGV[4] payload          canonical JSON object
-- ARGV[5] payload_digest   sha256 of the canonical payload
-- ARGV[6] idem_key         producer idempotency key, or ''
-- ARGV[7] manifest         frozen manifest JSON
-- ARGV[8] retry_policy     frozen retry policy JSON
-- ARGV[9] budget           frozen budget JSON
-- ARGV[10] lease_ms        lease length every claim of this task gets (at most the namespace ceiling)
-- ARGV[11] epoch           namespace epoch the client knows
-- ARGV[12] actor
-- ARGV[13] delay_ms         due this long after now (Redis clock), or '' / '0': now
-- ARGV[14] run_at_ms        due at this time (ms since the epoch), or '': now; with both, the later one
-- ARGV[15] start_by_ms      the task must have started by then (ms, Redis clock), or '': no such deadline
-- ARGV[16] finish_by_ms     the task must have ended by then (ms, Redis clock), or '': no such deadline
-- ARGV[17] priority         1 (most urgent) .. 9, or '' for the default (5): which RQ queue its Attempts go to
-- Returns: {'OK', task_id, task, attempts, events} (task: HGETALL of the task hash, which holds its
--          Attempt; attempts and events empty: what the producer returns without reading the task again)
--          | {'DUP', task_id} (same key or id, same payload)
--          {'E_CONFLICT', task_id, digest} (same key or id, different payload)
--          {'E_PURGED', task_id, until_ms} (the key's or id's task was purged)
--          {'E_OVERLOADED', why} (used memory above 90% of maxmemory: new work refused, nothing written;
--          a resend of work already admitted still answers DUP; the reading of INFO memory is kept in
--          meta for at most a second, or until the enqueues admitted on it may have used its room:
--          memory_pressure in common.lua)
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events: enqueue_refused (in the task's history, or the namespace log when the refused key names
--         another task). The task's creation and its first Attempt's are not stored: the task hash
--         implies them (mc_queue.contracts.history.whole_history).
-- Idempotent: yes (task id and idempotency key)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], idem = KEYS[4], queues = KEYS[5],
  counts = KEYS[6], task = KEYS[7], attempts = KEYS[8], events = KEYS[9], pending = KEYS[10], tomb = KEYS[11],
  tombs0 = KEYS[12], tombs1 = KEYS[13], tombs2 = KEYS[14], deadlines = KEYS[15]}
history_of(K.events, K.task)
K.attempts = K.task  -- a new task keeps its Attempts in its hash (attempts_of)
-- A retry policy or budget at version 1's base: not stored (mc_queue.contracts.frozen.OMITTED).
local DEFAULT_DOC = '{"$v":1}'
local A, bad = args(ARGV, {
  'task_id', 'id', 100, false,
  'queue', 'id', 64, false,
  'handler', 'id', 128, false,
  'payload', 'json', 524288, 'obj',
  'payload_digest', 'hex', 64, false,
  'idem_key', 'text', 512, false,
  'manifest', 'json', 65536, 'obj',
  'retry_policy', 'json', 16384, 'obj',
  'budget', 'json', 16384, 'obj',
  'lease_ms', 'int', 1, MAX_INT,
  'epoch', 'epoch', false, false,
  'actor', 'id', 200, false,
  'delay_ms', 'int?', 0, MAX_DELAY_MS,
  'run_at_ms', 'int?', 0, MAX_RUN_AT_MS,
  'start_by_ms', 'int?', 0, MAX_RUN_AT_MS,
  'finish_by_ms', 'int?', 0, MAX_RUN_AT_MS,
  'priority', 'int?', 1, 9,
})
if bad then return bad end
if not string.match(A.queue, '^[%w][%w_.%-]*$') then return {'E_BADARG', 'queue has characters outside [A-Za-z0-9_.-]'} end
if not string.match(A.handler, '^[%w][%w_.:%-]*$') then return {'E_BADARG', 'handler has characters outside [A-Za-z0-9_.:-]'} end
if string.sub(A.task_id, 1, #A.queue + 1) ~= A.queue .. ':' or
   not string.match(string.sub(A.task_id, #A.queue + 2), '^[0-9A-HJKMNP-TV-Z]+$') or #A.task_id ~= #A.queue + 27 then
  return {'E_BADARG', "task_id must be '<queue>:<26-character ULID>' of this queue"}
end
if string.find(A.idem_key, ' ', 1, true) then return {'E_BADARG', 'idem_key must not contain spaces'} end
local m = meta_read(K.meta)
if A.lease_ms > m.max_lease then
  return {'E_BADARG', 'lease_ms ' .. A.lease_ms .. ' is above the namespace ceiling of ' .. fmt(m.max_lease) .. ' ms'}
end
local err = ns_check(m, K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end

local ts = now_ms()
local sig = A.payload_digest .. '|' .. A.handler
local purged_key = false
if A.idem_key ~= '' then
  local entry = redis.call('HGET', K.idem, A.idem_key)
  if entry then
    local existing, esig, until_ms = string.match(entry, '^(%S+) (%S+) purged (%d+)$')
    if not existing then existing, esig = string.match(entry, '^(%S+) (%S+)$') end
    if until_ms and tonumber(until_ms) > ts then
      return refuse(K.nslog, nil, 'enqueue_refused', {'E_PURGED', existing, until_ms},
        {'idem_key', A.idem_key, 'task', existing, 'reason', 'the task of this key was purged', 'actor', A.actor})
    elseif until_ms then
      purged_key = true  -- its tombstone has expired: the key is free again
    elseif esig == sig and string.sub(existing, 1, #A.queue + 1) == A.queue .. ':' then
      return {'DUP', existing}
    else
      return refuse(K.nslog, nil, 'enqueue_refused', {'E_CONFLICT', existing, esig or ''},
        {'idem_key', A.idem_key, 'task', existing, 'actor', A.actor,
         'reason', 'the key names a task with another payload, handler or queue'})
    end
  end
end

if redis.call('EXISTS', K.task) == 1 then
  local e = redis.call('HMGET', K.task, 'payload_digest', 'handler', 'queue')
  if e[1] == A.payload_digest and e[2] == A.handler and e[3] == A.queue then return {'DUP', A.task_id} end
  return refuse(K.events, nil, 'enqueue_refused', {'E_CONFLICT', A.task_id, e[1] or ''},
    {'actor', A.actor, 'reason', 'the task id exists with another payload or handler', 'payload_digest', A.payload_digest})
end
local tomb = tomb_get(K.tombs0, K.tombs1, K.tombs2, K.tomb, A.task_id)
if tomb then
  local until_ms = tomb.until_ms
  if until_ms > ts then
    return refuse(K.nslog, nil, 'enqueue_refused', {'E_PURGED', A.task_id, fmt(until_ms)},
      {'task', A.task_id, 'reason', 'this task id was purged', 'actor', A.actor})
  end
end

-- Deadlines, on Redis's clock: one that has passed, or a start_by before the task is even due or after its
-- finish_by, could never be met: refused before anything is written (a resend of work admitted before has
-- answered DUP above).
local due = math.max(ts + (A.delay_ms or 0), A.run_at_ms or 0)
if A.start_by_ms and A.start_by_ms <= due then
  return {'E_BADARG', 'start_by_ms ' .. A.raw.start_by_ms .. ' is not after the time the task is due (' .. fmt(due) ..
    ' ms, Redis clock): it could never start in time'}
end
if A.finish_by_ms and (A.finish_by_ms <= due or (A.start_by_ms and A.finish_by_ms < A.start_by_ms)) then
  return {'E_BADARG', 'finish_by_ms ' .. A.raw.finish_by_ms .. ' is not after the time the task is due (' .. fmt(due) ..
    ' ms, Redis clock) and its start_by: it could never finish in time'}
end
local pressure = memory_pressure(ENQUEUE_MEMORY_SHARE, m, K.meta,
  enqueue_cost(#A.payload + #A.manifest + #A.retry_policy + #A.budget + #A.idem_key))
if pressure then return {'E_OVERLOADED', pressure} end

if purged_key then redis.call('HDEL', K.idem, A.idem_key) end
-- Numbers go to redis.call as strings: Redis would format each Lua number with '%.17g'.
local tss = fmt(ts)
-- A task not due yet waits 'scheduled' in the pending index, scored by its due time (the sweeper sends
-- it once due, the claim refuses it before); a due time not after now is the plain path.
local state = due > ts and 'scheduled' or 'pending'
local dues = due > ts and fmt(due) or tss
-- Left out until they say something (readers fill them in): updated_at while it is created_at, the
-- fence counter while no fence was issued ('0'), a retry policy or budget that is the default ('{"$v":1}').
local fields = {'id', A.task_id, 'queue', A.queue, 'handler', A.handler, 'payload', A.payload,
  'payload_digest', A.payload_digest, 'state', state, 'created_at', tss, 'attempts', '1', 'active', '1',
  'manifest', A.manifest, 'lease_ms', A.raw.lease_ms or fmt(A.lease_ms), 'actor', A.actor}
if A.retry_policy ~= DEFAULT_DOC then fields[#fields + 1] = 'retry_policy'; fields[#fields + 1] = A.retry_policy end
if A.budget ~= DEFAULT_DOC then fields[#fields + 1] = 'budget'; fields[#fields + 1] = A.budget end
if A.start_by_ms then fields[#fields + 1] = 'start_by'; fields[#fields + 1] = A.raw.start_by_ms end
if A.finish_by_ms then fields[#fields + 1] = 'finish_by'; fields[#fields + 1] = A.raw.finish_by_ms end
if A.priority and A.priority ~= 5 then fields[#fields + 1] = 'priority'; fields[#fields + 1] = A.raw.priority end
tset(K.task, fields)
-- An Attempt's frozen manifest is the task's (kept once, in the task hash; readers fill it in), its
-- worktree is its id, and Attempt 1's reason is 'first dispatch' and its created_at and due_at the
-- task's created_at (readers fill them in: not stored).
aset(K.attempts, 1, {'state', 'pending', unpack(state == 'scheduled' and {'due_at', dues} or {})})
if A.idem_key ~= '' then
  redis.call('HSET', K.task, 'idem_key', A.idem_key)
  redis.call('HSET', K.idem, A.idem_key, A.task_id .. ' ' .. sig)
end
redis.call('SADD', K.queues, A.queue)
redis.call('ZADD', K.pending, dues, A.task_id)
if A.start_by_ms or A.finish_by_ms then  -- the sweeper checks it then (the earlier deadline first)
  redis.call('ZADD', K.deadlines, A.start_by_ms and A.raw.start_by_ms or A.raw.finish_by_ms, A.task_id)
end
move_count(K.counts, A.queue, '', state)
-- No event is stored: task_created and Attempt 1's attempt_created say what the task hash holds
-- (created_at, actor, idem_key), and readers imply them (mc_queue.contracts.history.whole_history,
-- which gives them the ids '<created_at>-0' and '-1'; emit starts the list after them), with the
-- handler, payload digest and 'first dispatch' filled in (mc_queue.contracts.models.filled_in). A
-- queued task has no history key.
return {'OK', A.task_id, redis.call('HGETALL', K.task), {}, {}}  -- (its Attempt is in the task hash)
