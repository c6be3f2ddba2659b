-- mc_queue: enqueue_after
-- Create a Task and its first Attempt, as enqueue does, that waits for other tasks (its parents) to end
-- first: 'waiting' (no Attempt claimable, no lease, no transport message) until every parent has
-- ended as its mode asks, then pending (or scheduled, if its own delay or run_at lies ahead). Mode
-- 'succeeded': each parent must succeed; a parent that ends otherwise (failed, blocked, quarantined,
-- canceled) cancels this task, the parent named in the reason. Mode 'ended': any end counts.
-- A parent that already ended counts at once (or, in mode 'succeeded' and not succeeded, refuses this
-- enqueue: nothing written); one still to end records this task in its 'dependents' field, and its
-- own end puts it in the released index (common.lua index_end) for the sweeper's release.lua. A task
-- with no parent left to wait for is enqueued as enqueue would. Idempotent on the producer's key and
-- on the task id (a resend answers DUP whatever parents it names: the first enqueue's stand).
-- Plain enqueue does not read or write any of this: a task without parents pays nothing for it.
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
-- KEYS[16] caps      queue caps (queue_cap.lua): "<queue>" -> "<max depth> <source>" (backpressure: E_FULL)
-- KEYS[17] stats     counters for metrics: a refusal (E_FULL, E_OVERLOADED) counts "enqueue_refused|<queue>|<kind>"
-- ARGV[1] epoch           namespace epoch the client knows
-- ARGV[2] actor
-- ARGV[3] task_id
-- ARGV[4] queue
-- ARGV[5] handler
-- ARGV[6] payload          canonical JSON object
-- ARGV[7] payload_digest   sha256 of the canonical payload
-- ARGV[8] idem_key         producer idempotency key, or ''
-- ARGV[9] manifest         frozen manifest JSON
-- ARGV[10] retry_policy    frozen retry policy JSON
-- ARGV[11] budget          frozen budget JSON
-- ARGV[12] lease_ms        lease length every claim of this task gets (at most the namespace ceiling)
-- ARGV[13] delay_ms        due this long after now (Redis clock), or '' / '0': now
-- ARGV[14] run_at_ms       due at this time (ms since the epoch), or '': now; with both, the later one
-- ARGV[15] start_by_ms     the task must have started by then (ms, Redis clock), or '': no such deadline
-- ARGV[16] finish_by_ms    the task must have ended by then (ms, Redis clock), or '': no such deadline
-- ARGV[17] priority        1 (most urgent) .. 9, or '' for the default (5): which RQ queue its Attempts go to
-- ARGV[18] limits          the task's rate limits, '<key>=<cost>' joined by ',' (checked and taken by each claim),
--                          or '' for none
-- ARGV[19] fair_key        the task's fairness key (its Attempts' messages wait in that key's fair lane of
--                          their RQ queue: lua/fair_pop.lua), or '' for none
-- ARGV[20] after_mode      'succeeded' (every parent must succeed) | 'ended' (any end counts)
-- ITEMKEYS[1] parent       each parent's task hash
-- ITEMARGV[1] parent_id    each parent's task id (1 to 100 of them, each once, not this task)
-- Returns: {'OK', task_id, task, attempts, events} (as enqueue; the task hash says 'waiting' while a parent is
--          left) | {'DUP', task_id} | {'E_CONFLICT', task_id, digest} | {'E_PURGED', task_id, until_ms}
--          | {'E_NOTASK', why} (a parent is not in Redis: never enqueued, or purged)
--          | {'E_STATE', why} (mode 'succeeded' and a parent ended otherwise: it will not succeed unless a
--          person retries it) | {'E_BADARG', why} (too many parents, one named twice, itself, or one with
--          MAX_DEPENDENTS dependents waiting already) | {'E_OVERLOADED', why}
--          | {'E_FULL', why, retry_after_ms} (the queue is at its cap, or the task could not start by its start_by:
--            nothing written; admit.lua queue_room)
--          | {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current}
-- Events: enqueue_refused (as enqueue). None of its own: the task hash's 'after' and 'after_left' say what it waits for.
-- Idempotent: yes (task id and idempotency key)
--@include common
--@include admit

local MAX_PARENTS = 100
local MAX_DEPENDENTS = 1000  -- tasks waiting on one parent at once (its 'dependents' field: ids, space-joined)
local ULID = string.rep('[0-9A-HJKMNP-TV-Z]', 26)

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], idem = KEYS[4], queues = KEYS[5],
  counts = KEYS[6], task = KEYS[7], attempts = KEYS[8], events = KEYS[9], pending = KEYS[10], tomb = KEYS[11],
  tombs0 = KEYS[12], tombs1 = KEYS[13], tombs2 = KEYS[14], deadlines = KEYS[15], caps = KEYS[16],
  stats = KEYS[17]}
history_of(K.events, K.task)
K.attempts = K.task  -- a new task keeps its Attempts in its hash (attempts_of)
local A, bad = args(ARGV, with(enqueue_args(), {'after_mode', 'enum', '|succeeded|ended|', false}),
  {'parent_id', 'id', 100, false})
if bad then return bad end
local PARENTS = each_keys(KEYS, 18, {'parent'}, #A.items)
if not PARENTS then return {'E_BADARG', 'expected one key for each of the ' .. #A.items .. ' parents'} end
if #A.items > MAX_PARENTS then
  return {'E_BADARG', 'after names ' .. #A.items .. ' tasks: at most ' .. MAX_PARENTS .. ' (wait for a task that waits for the rest)'}
end
local m = meta_read(K.meta, true)
bad = enqueue_shape(A, m.max_lease)
if bad then return bad end
local named = {}
for i, P in ipairs(A.items) do
  local id = P.parent_id
  if not string.find(id, '^[%w][%w_.%-]*:' .. ULID .. '$') or #id > 91 then
    return {'E_BADARG', 'after: ' .. string.sub(id, 1, 100) .. " is not a task id ('<queue>:<26-character ULID>')"}
  end
  if id == A.task_id then return {'E_BADARG', 'after: a task cannot wait for itself'} end
  if named[id] then return {'E_BADARG', 'after: ' .. id .. ' is named twice'} end
  named[id] = true
  local K = PARENTS[i]  -- (in the loops K is the parent's)
  if string.sub(K.parent, -(#id + 3)) ~= ':t:' .. id then
    return {'E_BADARG', 'parent key ' .. i .. ' is not the task hash of ' .. id}
  end
end
local err = ns_check(m, K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end

local ts = now_ms()
local done, plan = enqueue_check(K, A, ts, A.actor)
if done then return done end
-- Every parent read before the first write.
local left, lists = {}, {}
for i, P in ipairs(A.items) do
  local K = PARENTS[i]
  local p = redis.call('HMGET', K.parent, 'id', 'state', 'dependents')
  if not p[1] then
    return {'E_NOTASK', 'no task ' .. P.parent_id .. ' to wait for (never enqueued in this namespace, or purged)'}
  end
  if HELD[p[2]] or DONE[p[2]] then
    if A.after_mode == 'succeeded' and p[2] ~= 'succeeded' then
      return {'E_STATE', 'task ' .. P.parent_id .. ' it would wait for ended ' .. p[2] .. ' and will not succeed unless ' ..
        'a person retries it: retry it first, or wait with after_mode ended'}
    end
  else
    local waiting = p[3] or ''
    if select(2, string.gsub(waiting, '%S+', '')) >= MAX_DEPENDENTS then
      return {'E_BADARG', 'after: ' .. P.parent_id .. ' has ' .. MAX_DEPENDENTS .. ' tasks waiting for it already, the most one ' ..
        'task may have (wait for a task that waits for it)'}
    end
    left[#left + 1] = i
    lists[i] = waiting
  end
end
local full, kind = queue_room(K, A, {due = plan.due, waiting = #left > 0}, ts, 0)
if full then
  refusal_counted(K.stats, A.queue, kind)
  return full
end
local pressure = memory_pressure(ENQUEUE_MEMORY_SHARE, m, K.meta, enqueue_cost(enqueue_bytes(A) + 100 * #A.items))
if pressure then
  refusal_counted(K.stats, A.queue, 'overloaded')
  return {'E_OVERLOADED', pressure}
end

plan.waiting = #left > 0
enqueue_write(K, A, plan, ts, A.actor)
local ids, waits = {}, {}
for i, P in ipairs(A.items) do ids[i] = P.parent_id end
redis.call('HSET', K.task, 'after', table.concat(ids, ' '), 'after_mode', A.after_mode)
for _, i in ipairs(left) do
  local K = PARENTS[i]
  waits[#waits + 1] = ids[i]
  -- the parent's own end puts it in the released index (index_end); a release done before (its
  -- 'released_at') is due again for this new dependent
  redis.call('HSET', K.parent, 'dependents', lists[i] == '' and A.task_id or (lists[i] .. ' ' .. A.task_id))
  redis.call('HDEL', K.parent, 'released_at')
end
if #waits > 0 then redis.call('HSET', K.task, 'after_left', table.concat(waits, ' ')) end
return {'OK', A.task_id, redis.call('HGETALL', K.task), {}, {}}
