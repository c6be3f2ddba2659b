-- mc_queue: periodic_decide
-- Decide one tick of a periodic schedule, once for every sweeper: the first caller to decide a tick
-- moves the schedule's cursor to it; every later caller is told it was decided (NOOP). A tick is skipped
-- (counted, never made) while the schedule is paused, when the caller says it was missed (its catch-up
-- policy, computed from the definition: contracts/periodic.py Periodic.plan), or when the task of the
-- previous tick has not ended and the overlap policy is 'skip'. Otherwise it runs: the task id chosen
-- now is kept as the schedule's pending tick until periodic_done confirms the task exists, so a sweeper
-- that dies in between leaves it for the next one, which makes the same task (same id, same producer
-- key): one task per tick, whoever makes it. Due and not due are judged on Redis's clock.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] state      the schedule's state hash
-- KEYS[5] prev       the task hash of the previous tick's task (the caller read it from state.last_task;
--                    when there is none, the state hash again: not read)
-- ARGV[1] tick       the tick (ms since the epoch, Redis's clock)
-- ARGV[2] count      ticks this decision stands for (more than 1 only for missed ticks skipped at once)
-- ARGV[3] task_id    the id of the task the tick makes if it runs
-- ARGV[4] prev_id    the schedule's last task as the caller read it ('' when none)
-- ARGV[5] overlap    'skip' | 'queue' | 'cancel': when the previous tick's task has not ended
-- ARGV[6] missed     '1': the tick was missed and its catch-up policy skips it; '' it may run
-- ARGV[7] actor
-- ARGV[8] epoch
-- Returns: {'OK', 'run', task_id, cancel_previous ('1' | '')} | {'OK', 'skip', why ('paused' | 'missed' |
--          'overlap')} | {'PENDING', tick, task_id, cancel_previous} (a tick decided to run whose task is
--          not confirmed yet: make it first) | {'NOOP', why} (decided already, not due yet, no such
--          schedule state, or the caller's view of the last task is old: read again)
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events: none (each decision is counted in the state: ran by periodic_done, skipped_paused,
--         skipped_missed, skipped_overlap)
-- Idempotent: yes (a tick is decided once: a second run answers NOOP or PENDING)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], state = KEYS[4], prev = KEYS[5]}
local A, bad = args(ARGV, {
  'tick', 'int', 0, MAX_RUN_AT_MS,
  'count', 'int', 1, MAX_INT,
  'task_id', 'id', 100, false,
  'prev_id', 'text', 100, false,
  'overlap', 'enum', '|skip|queue|cancel|', false,
  'missed', 'enum', '||1|', false,
  'actor', 'id', 200, false,
  'epoch', 'epoch', false, false,
})
if bad then return bad end
if A.count > 1 and A.missed ~= '1' then return {'E_BADARG', 'count above 1 is only for missed ticks'} end
if string.find(A.prev_id, '[%s%c]') then return {'E_BADARG', 'prev_id must not contain spaces or control characters'} end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end

local st = redis.call('HMGET', K.state, 'cursor', 'pending', 'last_task', 'paused')
if not st[1] then return {'NOOP', 'the schedule has no state: its App has not published it'} end
if st[2] then
  local t, id, cancel = string.match(st[2], '^(%d+) (%S+) ([01])$')
  return {'PENDING', t, id, cancel == '1' and '1' or ''}
end
local tick = A.raw.tick or fmt(A.tick)
if A.tick <= (tonumber(st[1]) or 0) then return {'NOOP', 'tick ' .. tick .. ' is decided already'} end
if A.tick > now_ms() then return {'NOOP', 'tick ' .. tick .. ' is not due yet'} end
if (st[3] or '') ~= A.prev_id then return {'NOOP', 'the last task changed since it was read: read again'} end

local function skip(why, n)
  redis.call('HINCRBY', K.state, 'skipped_' .. why, n)
  redis.call('HSET', K.state, 'cursor', tick)
  return {'OK', 'skip', why}
end
if st[4] then return skip('paused', A.raw.count or fmt(A.count)) end
if A.missed == '1' then return skip('missed', A.raw.count or fmt(A.count)) end
local running = false
if A.prev_id ~= '' then
  local ps = redis.call('HGET', K.prev, 'state')
  running = ps ~= false and ps ~= nil and not HELD[ps] and not DONE[ps]
end
if running and A.overlap == 'skip' then return skip('overlap', '1') end
local cancel = (running and A.overlap == 'cancel') and '1' or '0'
redis.call('HSET', K.state, 'cursor', tick, 'pending', tick .. ' ' .. A.task_id .. ' ' .. cancel)
return {'OK', 'run', A.task_id, cancel == '1' and '1' or ''}
