-- mc_queue: one task's enqueue, checked then written, shared by enqueue and enqueue_many ("--@include admit",
-- after common). Defines no KEYS/ARGV of its own: K is the script's (namespace keys and one task's), A one
-- task's arguments (ENQUEUE_ARGS).

-- ----------------------------------------------------------------------------------- enqueue

local DEFAULT_DOC = '{"$v":1}'  -- a retry policy or budget at version 1's base: not stored (frozen.OMITTED)

-- enqueue's arguments: its own two (epoch, actor), then one task's (enqueue_many's for each item, which
-- skips the first two: args' ``skip``). One literal: building a spec list from two cost an enqueue ~5 us.
local function enqueue_args()
  return {
    'epoch', 'epoch', false, false,
    'actor', 'id', 200, false,
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
    'delay_ms', 'int?', 0, MAX_DELAY_MS,
    'run_at_ms', 'int?', 0, MAX_RUN_AT_MS,
    'start_by_ms', 'int?', 0, MAX_RUN_AT_MS,
    'finish_by_ms', 'int?', 0, MAX_RUN_AT_MS,
    'priority', 'int?', 1, 9,
    'limits', 'limits', false, false,
    'fair_key', 'lkey?', false, false,
  }
end

-- What the argument kinds cannot say about one task: nil, or the E_BADARG reply.
local function enqueue_shape(A, max_lease)
  if not string.match(A.queue, '^[%w][%w_.%-]*$') then return {'E_BADARG', 'queue has characters outside [A-Za-z0-9_.-]'} end
  if not string.match(A.handler, '^[%w][%w_.:%-]*$') then
    return {'E_BADARG', 'handler has characters outside [A-Za-z0-9_.:-]'}
  end
  if string.sub(A.task_id, 1, #A.queue + 1) ~= A.queue .. ':' or
     not string.match(string.sub(A.task_id, #A.queue + 2), '^[0-9A-HJKMNP-TV-Z]+$') or #A.task_id ~= #A.queue + 27 then
    return {'E_BADARG', "task_id must be '<queue>:<26-character ULID>' of this queue"}
  end
  if string.find(A.idem_key, ' ', 1, true) then return {'E_BADARG', 'idem_key must not contain spaces'} end
  if A.lease_ms > max_lease then
    return {'E_BADARG', 'lease_ms ' .. A.lease_ms .. ' is above the namespace ceiling of ' .. fmt(max_lease) .. ' ms'}
  end
  return nil
end

-- What enqueueing one task would do, reading only: a reply that ends it ({'DUP', id}, or a refusal,
-- its audit event recorded), or nil and the plan enqueue_write carries out. K: nslog, idem, task,
-- events, tomb, tombs0..2. Deadlines are on Redis's clock: one that has passed, or a start_by before the
-- task is even due or after its finish_by, could never be met (refused after the DUP checks: a resend of
-- work admitted before answers DUP).
local function enqueue_check(K, A, ts, actor)
  local sig = A.payload_digest .. '|' .. A.handler
  local plan = {sig = sig, purged_key = false}
  if A.idem_key ~= '' then
    local entry = redis.call('HGET', K.idem, A.idem_key)
    if entry then
      local existing, esig, until_ms = string.match(entry, '^(%S+) (%S+) purged (%d+)$')
      if not existing then existing, esig = string.match(entry, '^(%S+) (%S+)$') end
      if until_ms and tonumber(until_ms) > ts then
        return refuse(K.nslog, nil, 'enqueue_refused', {'E_PURGED', existing, until_ms},
          {'idem_key', A.idem_key, 'task', existing, 'reason', 'the task of this key was purged', 'actor', actor})
      elseif until_ms then
        plan.purged_key = true  -- its tombstone has expired: the key is free again
      elseif esig == sig and string.sub(existing, 1, #A.queue + 1) == A.queue .. ':' then
        return {'DUP', existing}
      else
        return refuse(K.nslog, nil, 'enqueue_refused', {'E_CONFLICT', existing, esig or ''},
          {'idem_key', A.idem_key, 'task', existing, 'actor', actor,
           'reason', 'the key names a task with another payload, handler or queue'})
      end
    end
  end
  if redis.call('EXISTS', K.task) == 1 then
    local e = redis.call('HMGET', K.task, 'payload_digest', 'handler', 'queue', 'payload')
    -- (a payload of at most 64 bytes keeps no digest: the same payload is the same text)
    local same = e[1] and e[1] == A.payload_digest or (not e[1] and e[4] == A.payload)
    if same and e[2] == A.handler and e[3] == A.queue then return {'DUP', A.task_id} end
    local recorded = e[1] or (e[4] and #e[4] <= LONG_CHUNK and sha256_hex(e[4])) or ''
    return refuse(K.events, nil, 'enqueue_refused', {'E_CONFLICT', A.task_id, recorded},
      {'actor', actor, 'reason', 'the task id exists with another payload or handler', 'payload_digest', A.payload_digest})
  end
  local tomb = tomb_get(K.tombs0, K.tombs1, K.tombs2, K.tomb, A.task_id)
  if tomb and tomb.until_ms > ts then
    return refuse(K.nslog, nil, 'enqueue_refused', {'E_PURGED', A.task_id, fmt(tomb.until_ms)},
      {'task', A.task_id, 'reason', 'this task id was purged', 'actor', actor})
  end
  plan.due = math.max(ts + (A.delay_ms or 0), A.run_at_ms or 0)
  if A.start_by_ms and A.start_by_ms <= plan.due then
    return {'E_BADARG', 'start_by_ms ' .. A.raw.start_by_ms .. ' is not after the time the task is due (' ..
      fmt(plan.due) .. ' ms, Redis clock): it could never start in time'}
  end
  if A.finish_by_ms and (A.finish_by_ms <= plan.due or (A.start_by_ms and A.finish_by_ms < A.start_by_ms)) then
    return {'E_BADARG', 'finish_by_ms ' .. A.raw.finish_by_ms .. ' is not after the time the task is due (' ..
      fmt(plan.due) .. ' ms, Redis clock) and its start_by: it could never finish in time'}
  end
  return nil, plan
end

-- The room a cap leaves a task of priority p: the lowest priorities are shed first (1-5 may fill the cap, 6 four
-- fifths of it, 7 three, 8 two, 9 one).
local function shed_room(cap, p) return math.ceil(cap * math.min(1, (10 - p) / 5)) end

-- A cap by bytes ("<max bytes> <source>", or nil): nil when the task's payload fits beside the bytes its scope's
-- tasks not ended hold (counter: "<queue>|bytes" or "@<key>|bytes", common.lua move_count), else the reason.
local function bytes_over(K, A, setting, counter, added, scope)
  local cap = tonumber(string.match(setting or '', '^(%d+) '))
  if not cap then return nil end
  local used = added + (tonumber(redis.call('HGET', K.counts, counter) or '0') or 0)
  local p = A.priority or 5
  local room = shed_room(cap, p)
  if used + #A.payload <= room then return nil end
  return scope .. ' holds ' .. fmt(used) .. ' bytes of payload in tasks not ended; this one (' .. #A.payload ..
    ' bytes) is over its cap of ' .. fmt(cap) .. ' bytes' ..
    (room < cap and (' (' .. fmt(room) .. ' for priority ' .. p .. ': the lowest are shed first)') or '')
end

-- Backpressure per fairness key: a key's cap ("@<key>" in the caps hash, else its family's "@<name>:*") bounds the
-- tasks naming it that have not ended, in every queue ("@<key>|open" in the counts hash: common.lua move_count),
-- and its cap by bytes ("@<key>|bytes", else the family's) their payloads' bytes. Priorities are shed alike (the
-- lowest first). ``added``: tasks of this key an enqueue_many admitted before this one, ``added_bytes`` their
-- payloads' bytes. Returns nil (room) or {'E_FULL', why, retry_after_ms} (1 s: a key's own age is not known) and
-- what was full ('key_bytes' or 'key': refusal_counted's kinds).
local function key_room(K, A, added, added_bytes)
  local fam = string.match(A.fair_key, '^([^:]+):.')
  local famk = fam and ('@' .. fam .. ':*') or '@'
  local c = redis.call('HMGET', K.caps, '@' .. A.fair_key, famk, '@' .. A.fair_key .. '|bytes', famk .. '|bytes')
  local whose = c[1] and '' or (' (its family ' .. tostring(fam) .. ':*)')
  local over = bytes_over(K, A, c[3] or c[4], '@' .. A.fair_key .. '|bytes', added_bytes,
    'key ' .. A.fair_key .. (c[3] and '' or (c[4] and (' (its family ' .. fam .. ':*)') or '')))
  if over then return {'E_FULL', over, '1000'}, 'key_bytes' end
  local cap = tonumber(string.match(c[1] or c[2] or '', '^(%d+) '))
  if not cap then return nil end
  local depth = added + (tonumber(redis.call('HGET', K.counts, '@' .. A.fair_key .. '|open') or '0') or 0)
  local p = A.priority or 5
  local room = shed_room(cap, p)
  if depth < room then return nil end
  return {'E_FULL', 'key ' .. A.fair_key .. ' holds ' .. depth .. ' tasks not ended, its cap is ' .. cap .. whose ..
    (room < cap and (' (' .. room .. ' for priority ' .. p .. ': the lowest are shed first)') or ''), '1000'}, 'key'
end

-- A refused enqueue counts what refused it, per queue ("enqueue_refused|<queue>|<kind>" in the stats hash, a
-- counter the metrics read: mcq_enqueue_refused_total): backpressure and load shedding are seen where they
-- happen, though the refused producer's own call writes nothing else.
local function refusal_counted(k_stats, queue, kind)
  redis.call('HINCRBY', k_stats, 'enqueue_refused|' .. queue .. '|' .. kind, 1)
end

-- Backpressure: a queue's cap ("<queue>" in the caps hash: "<max depth> <source>", queue_cap.lua) bounds
-- the tasks it holds that have not ended (pending, scheduled, backoff, running, waiting). The lowest
-- priorities are shed first: priority 1-5 may fill the cap, 6 four fifths of it, 7 three, 8 two, 9 one.
-- With a cap, a task whose start_by the queue cannot meet is refused too: one due now would wait about as
-- long as the queue's oldest due Attempt has (its age), and that is past its start_by. ``added``: tasks of
-- this queue an enqueue_many admitted before this one (added_bytes: their payloads' bytes; added_key and
-- added_key_bytes: of the task's fairness key). A cap by bytes ("<queue>|bytes") bounds the payloads' bytes of the
-- tasks not ended. The task's fairness key's caps come first (key_room). Returns nil (room), or {'E_FULL', why,
-- retry_after_ms}: retry_after is an estimate, the queue's age times the share of it that must drain first (1 s
-- to 60 s; 1 s for a cap by bytes), and what refused it ('queue', 'queue_bytes', 'deadline', or key_room's).
-- K: caps, counts, pending.
local function queue_room(K, A, plan, ts, added, added_key, added_bytes, added_key_bytes)
  if A.fair_key ~= '' then
    local full, kind = key_room(K, A, added_key or 0, added_key_bytes or 0)
    if full then return full, kind end
  end
  local c = redis.call('HMGET', K.caps, A.queue, A.queue .. '|bytes')
  local over = bytes_over(K, A, c[2], A.queue .. '|bytes', added_bytes or 0, 'queue ' .. A.queue)
  if over then return {'E_FULL', over, '1000'}, 'queue_bytes' end
  local cap = tonumber(string.match(c[1] or '', '^(%d+) '))
  if not cap then return nil end
  local q = A.queue .. '|'
  local c = redis.call('HMGET', K.counts, q .. 'pending', q .. 'scheduled', q .. 'backoff', q .. 'running',
    q .. 'waiting')
  local depth = added
  for i = 1, 5 do depth = depth + (tonumber(c[i] or '0') or 0) end
  local function queue_age()  -- (read only when the answer needs it)
    local head = tonumber(redis.call('ZRANGE', K.pending, 0, 0, 'WITHSCORES')[2] or '')
    return head and head < ts and ts - head or 0
  end
  local p = A.priority or 5
  local room = shed_room(cap, p)
  if depth >= room then
    local over = depth - room + 1
    local why = 'queue ' .. A.queue .. ' holds ' .. depth .. ' tasks, its cap is ' .. cap ..
      (room < cap and (' (' .. room .. ' for priority ' .. p .. ': the lowest are shed first)') or '')
    return {'E_FULL', why, fmt(math.max(1000, math.min(60000, math.floor(queue_age() * over / math.max(1, depth)))))},
      'queue'
  end
  local age = A.start_by_ms and not plan.waiting and plan.due <= ts and queue_age() or 0
  if A.start_by_ms and not plan.waiting and plan.due <= ts and ts + age > A.start_by_ms then
    return {'E_FULL', 'queue ' .. A.queue .. "'s oldest due task has waited " .. fmt(age) .. ' ms: one enqueued ' ..
      'now would not start by its start_by (' .. A.raw.start_by_ms .. ' ms, Redis clock)', '0'}, 'deadline'
  end
  return nil
end

-- The bytes an enqueue of these arguments may cost (memory_pressure's estimate).
local function enqueue_bytes(A)
  return #A.payload + #A.manifest + #A.retry_policy + #A.budget + #A.idem_key + #A.limits + #A.fair_key
end

-- Write the task enqueue_check planned: its hash (holding Attempt 1), its producer key, its queue's
-- indexes and counts (a new task keeps its Attempts in its own hash). K: idem, queues, counts, task, pending,
-- deadlines. plan.waiting (enqueue_after): the task waits for others.
local function enqueue_write(K, A, plan, ts, actor)
  if plan.purged_key then redis.call('HDEL', K.idem, A.idem_key) end
  -- Numbers go to redis.call as strings: Redis would format each Lua number with '%.17g'.
  local tss = fmt(ts)
  -- A task not due yet waits 'scheduled' in the pending index, scored by its due time (the sweeper sends
  -- it once due, the claim refuses it before); a due time not after now is the plain path.
  -- A task waiting for others (enqueue_after: plan.waiting) is 'waiting' whatever its due time, and its
  -- pending entry scores +inf (no walk reaches it) until release.lua scores it by its due time.
  local state = plan.waiting and 'waiting' or (plan.due > ts and 'scheduled' or 'pending')
  local dues = plan.due > ts and fmt(plan.due) or tss
  -- Left out until they say something (readers fill them in): updated_at while it is created_at, the
  -- fence counter while no fence was issued ('0'), a retry policy or budget that is the default ('{"$v":1}').
  -- And the digest of a payload of at most 64 bytes, kept whole: it is the digest of the payload kept
  -- (readers compute it, mc_queue.contracts.models.payload_digest_of; so does the DUP check below).
  local fields = {'id', A.task_id, 'queue', A.queue, 'handler', A.handler, 'payload', A.payload,
    'state', state, 'created_at', tss, 'attempts', '1', 'active', '1',
    'manifest', A.manifest, 'lease_ms', A.raw.lease_ms or fmt(A.lease_ms), 'actor', actor}
  if #A.payload > LONG_CHUNK then
    fields[#fields + 1] = 'payload_digest'; fields[#fields + 1] = A.payload_digest
  end
  if A.retry_policy ~= DEFAULT_DOC then fields[#fields + 1] = 'retry_policy'; fields[#fields + 1] = A.retry_policy end
  if A.budget ~= DEFAULT_DOC then fields[#fields + 1] = 'budget'; fields[#fields + 1] = A.budget end
  if A.start_by_ms then fields[#fields + 1] = 'start_by'; fields[#fields + 1] = A.raw.start_by_ms end
  if A.finish_by_ms then fields[#fields + 1] = 'finish_by'; fields[#fields + 1] = A.raw.finish_by_ms end
  if A.priority and A.priority ~= 5 then fields[#fields + 1] = 'priority'; fields[#fields + 1] = A.raw.priority end
  if A.limits ~= '' then fields[#fields + 1] = 'limits'; fields[#fields + 1] = A.limits end
  if A.fair_key ~= '' then fields[#fields + 1] = 'fair_key'; fields[#fields + 1] = A.fair_key end
  tset(K.task, fields)
  -- An Attempt's frozen manifest is the task's (kept once, in the task hash; readers fill it in), its
  -- worktree is its id, and Attempt 1's reason is 'first dispatch' and its created_at and due_at the
  -- task's created_at (readers fill them in: not stored).
  aset(K.task, 1, {'state', 'pending', unpack(plan.due > ts and {'due_at', dues} or {})})
  if A.idem_key ~= '' then
    redis.call('HSET', K.task, 'idem_key', A.idem_key)
    redis.call('HSET', K.idem, A.idem_key, A.task_id .. ' ' .. plan.sig)
  end
  redis.call('SADD', K.queues, A.queue)
  redis.call('ZADD', K.pending, plan.waiting and '+inf' or dues, A.task_id)
  if A.start_by_ms or A.finish_by_ms then  -- the sweeper checks it then (the earlier deadline first)
    redis.call('ZADD', K.deadlines, A.start_by_ms and A.raw.start_by_ms or A.raw.finish_by_ms, A.task_id)
  end
  move_count(K.counts, A.queue, '', state, nil, A.fair_key, #A.payload)
  -- No event is stored: task_created and Attempt 1's attempt_created say what the task hash holds
  -- (created_at, actor, idem_key), and readers imply them (mc_queue.contracts.history.whole_history,
  -- which gives them the ids '<created_at>-0' and '-1'; emit starts the list after them), with the
  -- handler, payload digest and 'first dispatch' filled in (mc_queue.contracts.models.filled_in). A
  -- queued task has no history key.
end
