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
-- Returns: {'OK', task_id, task, attempts, events} (task: HGETALL of the task hash, which holds its
--          Attempt; attempts and events empty: what the producer returns without reading the task again)
--          | {'DUP', task_id} (same key or id, same payload)
--          {'E_CONFLICT', task_id, digest} (same key or id, different payload)
--          {'E_PURGED', task_id, until_ms} (the key's or id's task was purged)
--          | {'E_FULL', why, retry_after_ms} (the queue is at its cap, or the task could not start by its start_by:
--            nothing written; admit.lua queue_room)
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
--@include admit

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], idem = KEYS[4], queues = KEYS[5],
  counts = KEYS[6], task = KEYS[7], attempts = KEYS[8], events = KEYS[9], pending = KEYS[10], tomb = KEYS[11],
  tombs0 = KEYS[12], tombs1 = KEYS[13], tombs2 = KEYS[14], deadlines = KEYS[15], caps = KEYS[16],
  stats = KEYS[17]}
history_of(K.events, K.task)
K.attempts = K.task  -- a new task keeps its Attempts in its hash (attempts_of)
local A, bad = args(ARGV, enqueue_args())
if bad then return bad end
local m = meta_read(K.meta, true)
bad = enqueue_shape(A, m.max_lease)
if bad then return bad end
local err = ns_check(m, K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end

local ts = now_ms()
local done, plan = enqueue_check(K, A, ts, A.actor)
if done then return done end
local full, kind = queue_room(K, A, plan, ts, 0)
if full then
  refusal_counted(K.stats, A.queue, kind)
  return full
end
local pressure = memory_pressure(ENQUEUE_MEMORY_SHARE, m, K.meta, enqueue_cost(enqueue_bytes(A)))
if pressure then
  refusal_counted(K.stats, A.queue, 'overloaded')
  return {'E_OVERLOADED', pressure}
end
enqueue_write(K, A, plan, ts, A.actor)
return {'OK', A.task_id, redis.call('HGETALL', K.task), {}, {}}  -- (its Attempt is in the task hash)
