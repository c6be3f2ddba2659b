-- mc_queue: periodic_done
-- Close a schedule's pending tick: its task exists ('made': the schedule's last task is now that task,
-- counted in ran), or it cannot be made ('failed': the enqueue was refused for good; the tick is counted
-- in failed and recorded in the namespace log with why). A done tick is never made again.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] state      the schedule's state hash
-- KEYS[5] task       the task hash of the task made (made_id's)
-- ARGV[1] name       the schedule's name (for the namespace log)
-- ARGV[2] tick       the pending tick (ms)
-- ARGV[3] task_id    the pending tick's task id
-- ARGV[4] made_id    the task made: task_id, or the task the tick's producer key already named (a decision
--                    lost in a failover was made again with another id; the key made the first one)
-- ARGV[5] outcome    'made' | 'failed'
-- ARGV[6] why        with 'failed': why the task cannot be made
-- ARGV[7] actor
-- ARGV[8] epoch
-- Returns: {'OK'} | {'NOOP', why} (no such tick pending: closed already, or another one)
--          {'E_NOTASK', why} ('made' but the task does not exist)
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events (nslog): periodic_tick_failed
-- Idempotent: yes (a closed tick is not pending any more: NOOP)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], state = KEYS[4], task = KEYS[5]}
local A, bad = args(ARGV, {
  'name', 'name', false, false,
  'tick', 'int', 0, MAX_RUN_AT_MS,
  'task_id', 'id', 100, false,
  'made_id', 'id', 100, false,
  'outcome', 'enum', '|made|failed|', false,
  'why', 'text', 2000, false,
  'actor', 'id', 200, false,
  'epoch', 'epoch', false, false,
})
if bad then return bad end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end

local tick = A.raw.tick or fmt(A.tick)
local pending = redis.call('HGET', K.state, 'pending')
local t, id = string.match(pending or '', '^(%d+) (%S+) [01]$')
if t ~= tick or id ~= A.task_id then return {'NOOP', 'tick ' .. tick .. ' of task ' .. A.task_id .. ' is not pending'} end
if A.outcome == 'made' then
  if redis.call('EXISTS', K.task) == 0 then return {'E_NOTASK', 'the task of tick ' .. tick .. ' is not made yet'} end
  redis.call('HSET', K.state, 'last_task', A.made_id, 'last_tick', tick)
  redis.call('HINCRBY', K.state, 'ran', 1)
else
  redis.call('HINCRBY', K.state, 'failed', 1)
  emit(K.nslog, 'periodic_tick_failed', {'schedule', A.name, 'tick', tick, 'task', A.task_id, 'reason', A.why,
    'actor', A.actor})
end
redis.call('HDEL', K.state, 'pending')
return {'OK'}
