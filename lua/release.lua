-- mc_queue: release
-- Carry out what a task's end owes the tasks waiting for it (enqueue_after.lua): its end put it in the
-- released index in the same step (common.lua index_end); the sweeper calls this for each entry. For
-- each waiting dependent that still counts this parent: in mode 'succeeded' with a parent that did not
-- succeed, the dependent is canceled (Attempt 1 canceled, the parent and its state in the reason; its
-- own dependents are then owed the same, through the released index); otherwise the parent counts as
-- met, and a dependent with no parent left becomes pending (or scheduled until its own due time) and
-- is scored in its queue's pending index for the transport. A dependent no longer waiting (canceled by
-- an operator or a deadline meanwhile), gone, or that counted this parent already, is left as it is.
-- A parent that is not ended (a person retried it before this ran) owes nothing yet: its entry goes,
-- and its next end puts it back. The caller names the dependents as it read them from the parent's
-- 'dependents' field; if that changed since, nothing is written (E_CHANGED: read again).
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] counts     "<queue>|<state>" counters
-- KEYS[5] released   tasks that ended with dependents waiting -> when (ms)
-- KEYS[6] stats      counters for metrics (here: dependents released and canceled)
-- KEYS[7] parent     the ended task's hash
-- ITEMKEYS[1] task     each dependent's task hash (which holds its Attempts)
-- ITEMKEYS[2] events   its history
-- ITEMKEYS[3] pending  its queue's pending index
-- ITEMKEYS[4] done     its queue's finished tasks
-- ITEMKEYS[5] held     its queue's tasks waiting for a person
-- ARGV[1] epoch           namespace epoch the client knows
-- ARGV[2] actor
-- ARGV[3] parent_id       the ended task's id
-- ITEMARGV[1] task_id     each dependent's id, in the order of the parent's 'dependents' field (none
--                         when the parent has none: its entry is removed)
-- Returns: {'OK', released, canceled, left, scheduled} (dependents made pending; canceled; counted and still
--          waiting for other parents; made scheduled, their own due time ahead) | {'NOOP', why} (the parent is gone or not ended: its entry is removed)
--          | {'E_CHANGED', why} (its dependents are not the ones named: read again) | {'E_NSLOST', why}
--          | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events: dependency_met | task_canceled (each in the dependent's history)
-- Idempotent: yes (a dependent counts a parent once: it leaves its 'after_left' as it is counted)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], counts = KEYS[4], released = KEYS[5], stats = KEYS[6],
  parent = KEYS[7]}
local A, bad = args(ARGV, {
  'epoch', 'epoch', false, false,
  'actor', 'id', 200, false,
  'parent_id', 'id', 100, false,
}, {'task_id', 'id', 100, false}, 0, true)
if bad then return bad end
local ITEMS = each_keys(KEYS, 8, {'task', 'events', 'pending', 'done', 'held'}, #A.items)
if not ITEMS then return {'E_BADARG', 'expected 5 keys for each of the ' .. #A.items .. ' dependents'} end
if string.sub(K.parent, -(#A.parent_id + 3)) ~= ':t:' .. A.parent_id then
  return {'E_BADARG', 'parent is not the task hash of ' .. A.parent_id}
end
for i, I in ipairs(A.items) do
  if string.sub(ITEMS[i].task, -(#I.task_id + 3)) ~= ':t:' .. I.task_id then
    return {'E_BADARG', 'item ' .. i .. ': task is not the task hash of ' .. I.task_id, i}
  end
end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end

local p = redis.call('HMGET', K.parent, 'id', 'state', 'dependents')
if not p[1] or not (HELD[p[2]] or DONE[p[2]]) then
  redis.call('ZREM', K.released, A.parent_id)
  return {'NOOP', p[1] and ('the task is ' .. p[2] .. ', not ended: its next end releases them') or 'no such task'}
end
local named = {}
for i, I in ipairs(A.items) do named[i] = I.task_id end
if table.concat(named, ' ') ~= (p[3] or '') then
  return {'E_CHANGED', 'the tasks waiting for ' .. A.parent_id .. ' are not the ones named: read its dependents again'}
end

-- In the loop K is the dependent's: the namespace keys and its own.
local NS = K
local ts = now_ms()
local tss = fmt(ts)
local pstate = p[2]
local released, canceled, left, scheduled = {}, {}, {}, {}
for i, I in ipairs(A.items) do
  local T = ITEMS[i]
  local K = {counts = NS.counts, released = NS.released, stats = NS.stats, task = T.task, events = T.events,
    pending = T.pending, done = T.done, held = T.held}
  local d = redis.call('HMGET', K.task, 'id', 'state', 'queue', 'after_left', 'after_mode', '1.due_at')
  local waits = {}
  local counts_it = false
  for id in string.gmatch(d[4] or '', '%S+') do
    if id == A.parent_id then counts_it = true else waits[#waits + 1] = id end
  end
  if d[1] and d[2] == 'waiting' and counts_it then
    history_of(K.events, K.task)
    local queue = d[3]
    if d[5] == 'succeeded' and pstate ~= 'succeeded' then
      local why = 'after: task ' .. A.parent_id .. ' it waited for ended ' .. pstate .. ', not succeeded'
      aset(K.task, 1, {'state', 'canceled', 'ended_at', tss, 'settled_by', 'cancel'})
      redis.call('HSET', K.task, 'state', 'canceled', 'active', '', 'updated_at', tss, 'after_left', table.concat(waits, ' '))
      redis.call('ZREM', K.pending, I.task_id)
      move_count(K.counts, queue, 'waiting', 'canceled', K.task)
      index_end(K, I.task_id, 'waiting', 'canceled', ts)
      emit(K.events, 'task_canceled', {'attempt', '1', 'actor', A.actor, 'reason', why, 'parent', A.parent_id,
        'parent_state', pstate})
      redis.call('HINCRBY', K.stats, 'dependents|' .. queue .. '|canceled', '1')
      canceled[#canceled + 1] = I.task_id
    elseif #waits > 0 then
      redis.call('HSET', K.task, 'after_left', table.concat(waits, ' '), 'updated_at', tss)
      emit(K.events, 'dependency_met', {'parent', A.parent_id, 'parent_state', pstate, 'left', #waits})
      left[#left + 1] = I.task_id
    else
      -- Every parent counted: due now, or at its own due time (a delay or run_at given at enqueue). Its
      -- wait is measured from now (Attempt 1's due_at: the claim's wait metric, the queue age).
      local due = tonumber(d[6] or '') or 0
      local state = due > ts and 'scheduled' or 'pending'
      if due <= ts then aset(K.task, 1, {'due_at', tss}) end
      redis.call('HSET', K.task, 'state', state, 'updated_at', tss)
      redis.call('HDEL', K.task, 'after_left')
      redis.call('ZADD', K.pending, due > ts and fmt(due) or tss, I.task_id)
      move_count(K.counts, queue, 'waiting', state, K.task)
      emit(K.events, 'dependency_met', {'parent', A.parent_id, 'parent_state', pstate, 'left', '0', 'state', state})
      redis.call('HINCRBY', K.stats, 'dependents|' .. queue .. '|released', '1')
      if state == 'pending' then released[#released + 1] = I.task_id else scheduled[#scheduled + 1] = I.task_id end
    end
  end
end
redis.call('HSET', K.parent, 'released_at', tss)
redis.call('ZREM', K.released, A.parent_id)
return {'OK', released, canceled, left, scheduled}
