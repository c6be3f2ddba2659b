-- mc_queue: retry
-- Append Attempt N+1 with its recorded reason and hypothesis. Mission Control's rules: only with
-- no active Attempt, the latest one failed, and a reason of at least ten characters; succeeded,
-- canceled and quarantined tasks never run again. A delay makes the task wait in backoff.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] counts     "<queue>|<state>" counters
-- KEYS[5] task       task hash
-- KEYS[6] attempts   attempts hash
-- KEYS[7] events     task event stream
-- KEYS[8] pending    the queue's pending index
-- KEYS[9] outbox     attempts waiting to be dispatched to the transport
-- KEYS[10] attention attention items (resolved by this decision)
-- ARGV[1] reason      why another Attempt (>= 10 characters)
-- ARGV[2] hypothesis  what is different this time, or ''
-- ARGV[3] actor       who decides (operator, policy)
-- ARGV[4] request_id  a resend with the same id returns the same Attempt
-- ARGV[5] delay_ms    wait before the new Attempt may be claimed
-- ARGV[6] epoch
-- Returns: {'OK', n, due_at, attempt_fields} | {'DUP', n, due_at, attempt_fields}
--          {'E_RETRY', why} | {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events: attempt_created (retry_of, reason, hypothesis) | retry_refused
-- Idempotent: by request id
--@include common

local k_meta, k_epochs, k_nslog, k_counts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local k_task, k_att, k_ev, k_pending, k_outbox, k_attention = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local reason, hypothesis, actor, req, delay, epoch = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]

if not delay or delay < 0 or delay ~= math.floor(delay) then return {'E_BADARG', 'delay_ms must be an integer >= 0'} end
local err = ns_check(k_meta, k_epochs, k_nslog, epoch, '0', actor, false)
if err then return err end
local t = redis.call('HMGET', k_task, 'id', 'queue', 'state', 'attempts', 'active', 'manifest')
if not t[1] then return {'E_NOTASK', 'no such task'} end
local task_id, queue, state, n = t[1], t[2], t[3], tonumber(t[4])
local latest = redis.call('HMGET', k_att, n .. '.state', n .. '.create_req', n .. '.due_at')
if req ~= '' and latest[2] == req then return {'DUP', n, latest[3], attempt_snapshot(k_att, n)} end

local why = nil
local trimmed = string.gsub(reason, '^%s*(.-)%s*$', '%1')
if state == 'succeeded' or state == 'canceled' or state == 'quarantined' then
  why = 'task is ' .. state .. ' and never runs again'
elseif t[5] ~= '' then
  why = 'attempt ' .. t[5] .. ' is still ' .. tostring(latest[1])
elseif latest[1] ~= 'failed' then
  why = 'the latest attempt (' .. n .. ') is ' .. tostring(latest[1]) .. ', not failed'
elseif select(2, string.gsub(trimmed, '[^\128-\191]', '')) < 10 then  -- characters, not bytes
  why = 'a retry needs a recorded reason of at least ten characters'
end
if why then
  emit(k_ev, 'retry_refused', {'attempt', n, 'actor', actor, 'reason', why})
  return {'E_RETRY', why}
end

local ts = now_ms()
local m = n + 1
local due = ts + delay
local new_state = (delay > 0) and 'backoff' or 'pending'
aset(k_att, m, {'state', 'pending', 'created_at', ts, 'due_at', due, 'prev', n, 'reason', trimmed,
  'hypothesis', hypothesis, 'manifest', t[6], 'worktree', task_id .. '/' .. m, 'create_req', req,
  'retry_by', actor})
redis.call('HSET', k_task, 'state', new_state, 'attempts', m, 'active', m, 'updated_at', ts)
redis.call('ZADD', k_pending, due, task_id)
redis.call('ZADD', k_outbox, due, task_id .. '/' .. m)
redis.call('HDEL', k_attention, task_id)
move_count(k_counts, queue, state, new_state)
emit(k_ev, 'attempt_created', {'attempt', m, 'retry_of', n, 'actor', actor, 'reason', trimmed,
  'hypothesis', hypothesis, 'due_at', due})
return {'OK', m, due, attempt_snapshot(k_att, m)}
