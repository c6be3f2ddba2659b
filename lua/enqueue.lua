-- mc_queue: enqueue
-- Create a Task and its first Attempt (pending, claimable now). The first dispatch exists only
-- because there is no prior Attempt. Idempotent on the producer's key and on the task id.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] idem       producer idempotency key -> task id
-- KEYS[5] queues     set of queue names
-- KEYS[6] counts     "<queue>|<state>" counters
-- KEYS[7] task       task hash
-- KEYS[8] attempts   attempts hash
-- KEYS[9] events     task event stream
-- KEYS[10] pending   the queue's pending index
-- KEYS[11] outbox   attempts waiting to be dispatched to the transport
-- ARGV[1] task_id
-- ARGV[2] queue
-- ARGV[3] handler
-- ARGV[4] payload          canonical JSON
-- ARGV[5] payload_digest   sha256 of the canonical payload
-- ARGV[6] idem_key         producer idempotency key, or ''
-- ARGV[7] manifest         frozen manifest JSON
-- ARGV[8] retry_policy     policy reference, or ''
-- ARGV[9] budget           budget reference, or ''
-- ARGV[10] epoch           namespace epoch the client knows
-- ARGV[11] actor
-- Returns: {'OK', task_id} | {'DUP', task_id} (same key or id, same payload)
--          {'E_CONFLICT', task_id, digest} (same key or id, different payload)
--          {'E_NSLOST', why} | {'E_EPOCH', current}
-- Events: task_created, attempt_created
-- Idempotent: yes (task id and idempotency key)
--@include common

local k_meta, k_epochs, k_nslog, k_idem, k_queues, k_counts = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local k_task, k_att, k_ev, k_pending, k_outbox = KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local task_id, queue, handler, payload, digest = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local idem_key, manifest, policy, budget, epoch, actor = ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11]

local err = ns_check(k_meta, k_epochs, k_nslog, epoch, '0', actor, false)
if err then return err end

-- The idempotency entry holds "<task id> <payload digest>|<handler>", so a replay is recognised
-- without reading a task key the caller could not name in KEYS.
local sig = digest .. '|' .. handler
if idem_key ~= '' then
  local entry = redis.call('HGET', k_idem, idem_key)
  if entry then
    local sp = string.find(entry, ' ', 1, true)
    local existing, esig = string.sub(entry, 1, sp - 1), string.sub(entry, sp + 1)
    if esig == sig and string.sub(existing, 1, #queue + 1) == queue .. ':' then
      return {'DUP', existing}
    end
    return {'E_CONFLICT', existing, esig}
  end
end

if redis.call('EXISTS', k_task) == 1 then
  local e = redis.call('HMGET', k_task, 'payload_digest', 'handler', 'queue')
  if e[1] == digest and e[2] == handler and e[3] == queue then return {'DUP', task_id} end
  return {'E_CONFLICT', task_id, e[1] or ''}
end

local ts = now_ms()
redis.call('HSET', k_task, 'id', task_id, 'queue', queue, 'handler', handler, 'payload', payload,
  'payload_digest', digest, 'idem_key', idem_key, 'state', 'pending', 'created_at', ts, 'updated_at', ts,
  'fence', 0, 'attempts', 1, 'active', 1, 'manifest', manifest, 'retry_policy', policy, 'budget', budget)
aset(k_att, 1, {'state', 'pending', 'created_at', ts, 'due_at', ts, 'manifest', manifest,
  'worktree', task_id .. '/1', 'reason', 'first dispatch'})
if idem_key ~= '' then
  redis.call('HSET', k_idem, idem_key, task_id .. ' ' .. sig)
end
redis.call('SADD', k_queues, queue)
redis.call('ZADD', k_pending, ts, task_id)
redis.call('ZADD', k_outbox, ts, task_id .. '/1')
move_count(k_counts, queue, '', 'pending')
emit(k_ev, 'task_created', {'actor', actor, 'handler', handler, 'payload_digest', digest, 'idem_key', idem_key})
emit(k_ev, 'attempt_created', {'attempt', 1, 'actor', actor, 'reason', 'first dispatch'})
return {'OK', task_id}
