-- mc_queue: shared helpers, pasted into a script where it says "--@include common".
-- Defines no KEYS/ARGV of its own. Every helper that writes is called only after the calling
-- script has validated everything it needs (Lua in Redis is isolated, not all-or-nothing).

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Integers up to 2^53 as decimal strings (tostring would print 1.7e+15).
local function fmt(n)
  return string.format('%.0f', n)
end

-- Append one event to a stream. fields: flat list of name, value; empty values are left out.
local function emit(key, typ, fields)
  local args = {'XADD', key, '*', 'type', typ}
  for i = 1, #fields, 2 do
    local v = fields[i + 1]
    if v ~= nil and v ~= '' and v ~= false then
      args[#args + 1] = fields[i]
      args[#args + 1] = tostring(v)
    end
  end
  return redis.call(unpack(args))
end

-- Attempt fields live in one hash per task as "<n>.<field>".
local function aget(k_att, n, field)
  return redis.call('HGET', k_att, n .. '.' .. field)
end

local function aset(k_att, n, fields)
  local args = {'HSET', k_att}
  for i = 1, #fields, 2 do
    args[#args + 1] = n .. '.' .. fields[i]
    args[#args + 1] = tostring(fields[i + 1])
  end
  redis.call(unpack(args))
end

local TERMINAL_ATTEMPT = {succeeded = true, failed = true, canceled = true}

local function move_count(k_counts, queue, from, to)
  if from == to then return end
  if from and from ~= '' then redis.call('HINCRBY', k_counts, queue .. '|' .. from, -1) end
  if to and to ~= '' then redis.call('HINCRBY', k_counts, queue .. '|' .. to, 1) end
end

-- The run id of this redis-server process (a new one at every start), or nil if INFO is not allowed.
local function run_id()
  local info = redis.pcall('INFO', 'server')
  if type(info) ~= 'string' then return nil end
  return string.match(info, 'run_id:(%x+)')
end

-- The next fence for a task: one above the current one and above the namespace floor.
-- The floor is raised to Redis TIME in microseconds by `mcq recover`, and also by the first fence
-- issued by a redis-server process that did not issue the previous one (a restart, a failover):
-- its data may be an older copy whose counters are behind, but the clock is not, so no fence
-- handed out before the restart can come again, even if nobody noticed a loss yet.
local function next_fence(k_meta, current)
  local m = redis.call('HMGET', k_meta, 'floor', 'run_id')
  local floor = tonumber(m[1] or '0') or 0
  local rid = run_id()
  if rid == nil or rid ~= m[2] then
    local t = now_us()
    if t > floor then floor = t end
    redis.call('HSET', k_meta, 'floor', fmt(floor), 'run_id', rid or '', 'restart_seen_at', now_ms())
  end
  local f = (tonumber(current) or 0) + 1
  if f <= floor then f = floor + 1 end
  return f
end

local function mark_lost(k_meta, k_nslog, why, who)
  local ts = now_ms()
  redis.call('HSET', k_meta, 'state', 'lost', 'lost_at', ts, 'lost_reason', why)
  if redis.call('HEXISTS', k_meta, 'floor') == 0 then redis.call('HSET', k_meta, 'floor', 0, 'seq', 0) end
  emit(k_nslog, 'state_loss_detected', {'reason', why, 'actor', who})
  return {'E_NSLOST', why}
end

-- An epoch is "<Redis TIME in microseconds>.<nonce>": epochs are ordered by when they were made.
local function new_epoch(nonce)
  return fmt(now_us()) .. '.' .. nonce
end

local function epoch_time(e)
  return tonumber(string.match(e or '', '^(%d+)%.') or '')
end

-- Is the namespace usable? nil when yes, else an error reply. A missing meta, an unknown epoch or
-- a claim sequence lower than one a client has already seen means Redis lost acknowledged state:
-- the namespace is marked lost and refuses transitions until `mcq recover` has run.
-- An epoch older than the current one is retired (not lost) only once a recovery has run: then the
-- fence floor already lies above every fence issued under it. Without a recovery, an epoch this
-- Redis does not hold means it lost the namespace and someone re-created it.
-- allow_retired: a fenced write from before a recovery goes on to the fence check (which refuses it).
local function ns_check(k_meta, k_epochs, k_nslog, epoch, min_seq, who, allow_retired)
  local m = redis.call('HMGET', k_meta, 'state', 'epoch', 'seq', 'recovered_at')
  if not m[1] then
    return mark_lost(k_meta, k_nslog,
      'namespace meta is missing: Redis lost its data (restart without persistence, flush, or an older snapshot)', who)
  end
  if m[1] ~= 'ok' then
    return {'E_NSLOST', 'namespace state is ' .. m[1] .. ' (' .. (redis.call('HGET', k_meta, 'lost_reason') or '') .. '): run `mcq recover`'}
  end
  if epoch ~= '' and epoch ~= m[2] then
    local pt, ct = epoch_time(epoch), epoch_time(m[2])
    if redis.call('SISMEMBER', k_epochs, epoch) == 1 or (m[4] and pt and ct and pt < ct) then
      if allow_retired then return nil end
      return {'E_EPOCH', m[2]}
    end
    return mark_lost(k_meta, k_nslog, 'a client presented epoch ' .. epoch .. ' which this Redis never issued (current ' .. m[2] .. ')', who)
  end
  if (tonumber(min_seq) or 0) > (tonumber(m[3]) or 0) then
    return mark_lost(k_meta, k_nslog, 'claim sequence went backwards: a client saw ' .. min_seq .. ', Redis has ' .. (m[3] or '0'), who)
  end
  return nil
end

-- The check every fenced write (renew, complete, fail, checkpoint, ...) makes before writing.
-- Returns nil when the write may go on; otherwise records a stale_write_refused event and returns
-- the error reply. A presented fence above the current one proves Redis went back in time.
local function fence_check(k_meta, k_nslog, k_stats, k_task, k_att, k_ev, n, fence, worker, digest, op, ts)
  local t = redis.call('HMGET', k_task, 'fence', 'attempts')
  if not t[1] then return {'E_NOTASK', 'no such task'} end
  local cur = tonumber(t[1])
  local presented = tonumber(fence)
  if presented == nil then return {'E_BADARG', 'fence must be an integer'} end
  if presented > cur then
    emit(k_ev, 'state_loss_detected', {'attempt', n, 'op', op, 'presented_fence', fence, 'current_fence', fmt(cur), 'worker', worker})
    return mark_lost(k_meta, k_nslog, 'a worker presented fence ' .. fence .. ' but Redis holds ' .. fmt(cur) .. ' for ' .. k_task, worker)
  end
  local state = aget(k_att, n, 'state')
  local refusal = nil
  local code = nil
  if presented ~= cur or tostring(n) ~= t[2] then
    refusal, code = 'stale_fence', 'E_STALE'
  elseif state ~= 'running' then
    refusal, code = 'attempt_' .. tostring(state), 'E_STATE'
  elseif ts >= tonumber(aget(k_att, n, 'lease_exp')) then
    refusal, code = 'lease_expired', 'E_EXPIRED'
  end
  if refusal then
    redis.call('HINCRBY', k_stats, 'stale_write_refused', 1)
    emit(k_ev, 'stale_write_refused', {'attempt', n, 'op', op, 'refusal', refusal, 'presented_fence', fence,
      'current_fence', fmt(cur), 'worker', worker, 'payload_digest', digest, 'attempt_state', state or 'missing'})
    return {code, fmt(cur), tostring(state), aget(k_att, n, 'lease_exp') or ''}
  end
  return nil
end

-- After a cancel request the executor may renew (to hear the signal) and record receipts of effects
-- already made, but it may not start an effect, checkpoint, complete or fail: it acknowledges.
local function cancel_check(k_task, k_ev, n, worker, digest, op)
  local reason = redis.call('HGET', k_task, 'cancel_requested')
  if not reason then return nil end
  emit(k_ev, 'stale_write_refused', {'attempt', n, 'op', op, 'refusal', 'cancel_requested', 'worker', worker,
    'payload_digest', digest, 'reason', reason})
  return {'E_CANCELED', reason}
end

-- All fields of Attempt n as a flat list (name, value, ...), without the "<n>." prefix.
local function attempt_snapshot(k_att, n)
  local prefix = n .. '.'
  local out = {}
  local all = redis.call('HGETALL', k_att)
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, #prefix) == prefix then
      out[#out + 1] = string.sub(all[i], #prefix + 1)
      out[#out + 1] = all[i + 1]
    end
  end
  return out
end

-- Apply the decision that follows a failed Attempt n, in the same script as the failure:
--   ''/'wait'  the task waits in failed for a person (retry_task);
--   'retry'    Attempt n+1 pending, due after delay_ms (task backoff, or pending when 0);
--   'stop'     the task is blocked and an attention item is recorded;
--   'quarantine' the task is dead-lettered with its history (and an attention item).
-- Returns the task's new state. Callers validate the decision name before their first write.
local DECISIONS = {[''] = 'failed', wait = 'failed', retry = 'backoff', stop = 'blocked', quarantine = 'quarantined'}

local function apply_decision(k_task, k_att, k_ev, k_pending, k_outbox, k_counts, k_attention, k_dlq, k_stats,
                               task_id, queue, n, from_state, d, ts)
  local state = DECISIONS[d.action]
  if d.action ~= '' and d.action ~= 'wait' then
    redis.call('HINCRBY', k_stats, 'decision:' .. d.action .. ':' .. (d.fclass or ''), 1)
  end
  if d.budget and d.budget ~= '' then redis.call('HINCRBY', k_stats, 'budget_exhausted:' .. d.budget, 1) end
  if d.action == 'retry' then
    local m = tonumber(n) + 1
    local due = ts + d.delay_ms
    if d.delay_ms <= 0 then state = 'pending' end
    aset(k_att, m, {'state', 'pending', 'created_at', ts, 'due_at', due, 'prev', n, 'reason', d.reason,
      'hypothesis', d.hypothesis, 'manifest', redis.call('HGET', k_task, 'manifest'), 'worktree', task_id .. '/' .. m,
      'retry_by', d.actor})
    redis.call('HSET', k_task, 'state', state, 'attempts', m, 'active', m, 'updated_at', ts)
    redis.call('ZADD', k_pending, due, task_id)
    redis.call('ZADD', k_outbox, due, task_id .. '/' .. m)
    emit(k_ev, 'attempt_created', {'attempt', m, 'retry_of', n, 'actor', d.actor, 'reason', d.reason,
      'hypothesis', d.hypothesis, 'due_at', due, 'delay_ms', d.delay_ms, 'decision', d.why})
  else
    redis.call('HSET', k_task, 'state', state, 'active', '', 'updated_at', ts)
    if d.action == 'stop' or d.action == 'quarantine' then
      redis.call('HSET', k_attention, task_id, d.attention)
      emit(k_ev, 'attention_raised', {'attempt', n, 'actor', d.actor, 'reason', d.why, 'budget', d.budget})
    end
    if d.action == 'quarantine' then
      redis.call('ZADD', k_dlq, ts, task_id)
      emit(k_ev, 'task_quarantined', {'attempt', n, 'actor', d.actor, 'reason', d.why})
    end
  end
  move_count(k_counts, queue, from_state, state)
  return state
end
