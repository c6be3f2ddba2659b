-- mc_queue: enqueue_many
-- Create many tasks in one step, all or nothing: every item is checked before the first is written,
-- and one refused (a bad argument, a producer key or task id that names another task, a purged one, a
-- deadline that could never be met, two items with one key or id, memory above the mark for the whole
-- batch) refuses the batch: nothing is written but the refusal's audit event, and the reply names the
-- item. An item whose key or id names the same work admitted before (a resend) answers DUP and is not
-- written again, so the same batch sent twice makes each task once. Each new task is what enqueue makes.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] idem       producer idempotency key -> "<task id> <digest>|<handler>[ purged <until ms>]"
-- KEYS[5] queues     set of queue names
-- KEYS[6] counts     "<queue>|<state>" counters
-- KEYS[7] caps       queue caps (queue_cap.lua): "<queue>" -> "<max depth> <source>" (E_FULL: none written)
-- KEYS[8] stats      counters for metrics: a refusal (E_FULL, E_OVERLOADED) counts "enqueue_refused|<queue>|<kind>"
--                    (the refused item's queue; E_OVERLOADED: the first item's)
-- ITEMKEYS[1] task       each item's task hash (which holds its Attempts), then its keys as enqueue takes them
-- ITEMKEYS[2] events
-- ITEMKEYS[3] pending
-- ITEMKEYS[4] tomb
-- ITEMKEYS[5] tombs0
-- ITEMKEYS[6] tombs1
-- ITEMKEYS[7] tombs2
-- ITEMKEYS[8] deadlines
-- ARGV[1] epoch           namespace epoch the client knows
-- ARGV[2] actor
-- ITEMARGV[1] task_id         each item's arguments, as enqueue takes them
-- ITEMARGV[2] queue
-- ITEMARGV[3] handler
-- ITEMARGV[4] payload
-- ITEMARGV[5] payload_digest
-- ITEMARGV[6] idem_key
-- ITEMARGV[7] manifest
-- ITEMARGV[8] retry_policy
-- ITEMARGV[9] budget
-- ITEMARGV[10] lease_ms
-- ITEMARGV[11] delay_ms
-- ITEMARGV[12] run_at_ms
-- ITEMARGV[13] start_by_ms
-- ITEMARGV[14] finish_by_ms
-- ITEMARGV[15] priority
-- ITEMARGV[16] limits
-- ITEMARGV[17] fair_key
-- Returns: {'OK', codes, ids, tasks} (per item, in order: 'OK' | 'DUP', its task id, and for a new one the
--          HGETALL of its task hash, else {})
--          | a refusal of one item, with its number (1-based) last: {'E_CONFLICT', task_id, digest, item}
--          | {'E_PURGED', task_id, until_ms, item} | {'E_BADARG', why, item} | {'E_OVERLOADED', why}
--          | {'E_FULL', why, retry_after_ms, item} (an item's queue is at its cap, or it could not start by its
--            start_by: none written; admit.lua queue_room)
--          | {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events: enqueue_refused (the refused item's, as enqueue records it); nothing else on a refusal
-- Idempotent: yes (task ids and idempotency keys: a resend answers DUP for each item)
--@include common
--@include admit

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], idem = KEYS[4], queues = KEYS[5], counts = KEYS[6],
  caps = KEYS[7], stats = KEYS[8]}
local A, bad = args(ARGV, {'epoch', 'epoch', false, false, 'actor', 'id', 200, false}, enqueue_args(), 2)
if bad then return bad end
local ITEMS = each_keys(KEYS, 9, {'task', 'events', 'pending', 'tomb', 'tombs0', 'tombs1', 'tombs2', 'deadlines'},
  #A.items)
if not ITEMS then return {'E_BADARG', 'expected 8 keys for each of the ' .. #A.items .. ' items'} end
local m = meta_read(K.meta, true)
local seen = {}
for i, I in ipairs(A.items) do
  bad = enqueue_shape(I, m.max_lease)
  if bad then return {bad[1], 'item ' .. i .. ': ' .. bad[2], i} end
  for _, what in ipairs({'task id ' .. I.task_id, I.idem_key ~= '' and ('producer key ' .. I.idem_key) or nil}) do
    if seen[what] then return {'E_BADARG', 'items ' .. seen[what] .. ' and ' .. i .. ' have the same ' .. what, i} end
    seen[what] = i
  end
end
local err = ns_check(m, K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end

-- Every item checked before the first write (a refusal's audit event is all it leaves). In the loops K is
-- the item's: the namespace keys and its own.
local NS = K
local ts = now_ms()
local plans, codes, ids, bytes, added = {}, {}, {}, 0, {}
for i, I in ipairs(A.items) do
  local T = ITEMS[i]
  local K = {nslog = NS.nslog, idem = NS.idem, task = T.task, events = T.events, tomb = T.tomb, tombs0 = T.tombs0,
    tombs1 = T.tombs1, tombs2 = T.tombs2}
  history_of(K.events, K.task)
  local done, plan = enqueue_check(K, I, ts, A.actor)
  if done and done[1] ~= 'DUP' then
    done[#done + 1] = i
    return done
  end
  codes[i], ids[i], plans[i] = done and 'DUP' or 'OK', done and done[2] or I.task_id, plan
  if plan then
    bytes = bytes + enqueue_cost(enqueue_bytes(I))
    -- (in K: the queue's caps, counts and pending index; the batch's earlier items of its queue count too)
    K.caps, K.counts, K.pending, K.stats = NS.caps, NS.counts, T.pending, NS.stats
    local kb = '@' .. I.fair_key .. '|bytes'
    local full, kind = queue_room(K, I, plan, ts, added[I.queue] or 0, added['@' .. I.fair_key] or 0,
      added[I.queue .. '|bytes'] or 0, added[kb] or 0)
    if full then
      refusal_counted(K.stats, I.queue, kind)
      full[2] = 'item ' .. i .. ': ' .. full[2]
      full[#full + 1] = i
      return full
    end
    added[I.queue] = (added[I.queue] or 0) + 1
    added[I.queue .. '|bytes'] = (added[I.queue .. '|bytes'] or 0) + #I.payload
    if I.fair_key ~= '' then
      added['@' .. I.fair_key] = (added['@' .. I.fair_key] or 0) + 1
      added[kb] = (added[kb] or 0) + #I.payload
    end
  end
end
local pressure = memory_pressure(ENQUEUE_MEMORY_SHARE, m, K.meta, bytes)
if pressure then
  refusal_counted(K.stats, A.items[1] and A.items[1].queue or '-', 'overloaded')
  return {'E_OVERLOADED', pressure}
end

local tasks = {}
for i, I in ipairs(A.items) do
  tasks[i] = {}
  if plans[i] then
    local T = ITEMS[i]
    local K = {idem = NS.idem, queues = NS.queues, counts = NS.counts, task = T.task, pending = T.pending,
      deadlines = T.deadlines}
    enqueue_write(K, I, plans[i], ts, A.actor)
    tasks[i] = redis.call('HGETALL', K.task)
  end
end
return {'OK', codes, ids, tasks}
