-- mc_queue: claim
-- Take the task's pending Attempt: issue the next fence (INCR, above the namespace floor), set the
-- lease from Redis's clock, index it by expiry. A second caller is refused, never given a lease.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] counts     "<queue>|<state>" counters
-- KEYS[5] leases     lease expiry index
-- KEYS[6] task       task hash
-- KEYS[7] attempts   attempts hash
-- KEYS[8] events     task event stream
-- KEYS[9] pending    the queue's pending index
-- KEYS[10] outbox   attempts waiting to be dispatched to the transport
-- KEYS[11] stats      counters for metrics (refusals, expiries, decisions)
-- ARGV[1] worker     worker id
-- ARGV[2] lease_ms   lease length
-- ARGV[3] epoch      namespace epoch the client knows
-- ARGV[4] min_seq    highest claim sequence this client has seen (state-loss detection)
-- ARGV[5] request_id the caller's id for this claim; a resend returns the same lease
-- ARGV[6] expect_n   the attempt number the caller was sent to run, or '' for whichever is pending
-- Returns: {'OK', n, fence, lease_exp_ms, seq, now_ms} | {'DUP', ...same...}
--          {'E_CLAIM', why, holder} | {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_EPOCH', current}
--          {'E_BADARG', why}
-- Events: attempt_claimed | claim_refused
-- Idempotent: by request id
--@include common

local k_meta, k_epochs, k_nslog, k_counts, k_leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local k_task, k_att, k_ev, k_pending, k_outbox = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local k_stats = KEYS[11]
local worker, lease_ms, epoch, min_seq, req, expect_n = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5], ARGV[6]

if not lease_ms or lease_ms < 1 or lease_ms ~= math.floor(lease_ms) then
  return {'E_BADARG', 'lease_ms must be a positive integer'}
end
if worker == '' then return {'E_BADARG', 'worker id must not be empty'} end

local err = ns_check(k_meta, k_epochs, k_nslog, epoch, min_seq, worker, false)
if err then return err end

local t = redis.call('HMGET', k_task, 'state', 'attempts', 'queue', 'fence', 'id')
if not t[1] then return {'E_NOTASK', 'no such task'} end
local state, n, queue, task_id = t[1], t[2], t[3], t[5]
local aid = task_id .. '/' .. n
local a = redis.call('HMGET', k_att, n .. '.state', n .. '.claim_req', n .. '.fence', n .. '.lease_exp',
  n .. '.worker', n .. '.due_at', n .. '.seq')
local ts = now_ms()

if req ~= '' and a[2] == req and a[1] == 'running' then
  return {'DUP', tonumber(n), a[3], a[4], a[7] or '0', ts}
end

local why = nil
if expect_n ~= '' and expect_n ~= n then
  why = 'sent to run attempt ' .. expect_n .. ' but the task is at attempt ' .. n
elseif state ~= 'pending' and state ~= 'backoff' then
  why = 'task is ' .. state
elseif a[1] ~= 'pending' then
  why = 'attempt ' .. n .. ' is ' .. tostring(a[1])
elseif tonumber(a[6]) > ts then
  why = 'attempt ' .. n .. ' is not due for ' .. fmt(tonumber(a[6]) - ts) .. ' ms'
end
if why then
  redis.call('HINCRBY', k_stats, 'claim_refused', 1)
  emit(k_ev, 'claim_refused', {'attempt', n, 'worker', worker, 'reason', why, 'holder', a[5] or ''})
  return {'E_CLAIM', why, a[5] or ''}
end

local fence = next_fence(k_meta, t[4])
local seq = redis.call('HINCRBY', k_meta, 'seq', 1)
local exp = ts + lease_ms
redis.call('HSET', k_task, 'state', 'running', 'fence', fmt(fence), 'updated_at', ts)
aset(k_att, n, {'state', 'running', 'worker', worker, 'fence', fmt(fence), 'lease_exp', exp, 'hb_at', ts,
  'started_at', ts, 'claim_req', req, 'seq', seq, 'lease_ms', lease_ms})
redis.call('ZADD', k_leases, exp, aid)
redis.call('ZREM', k_pending, task_id)
redis.call('ZREM', k_outbox, aid)
move_count(k_counts, queue, state, 'running')
emit(k_ev, 'attempt_claimed', {'attempt', n, 'worker', worker, 'fence', fmt(fence), 'lease_exp', exp})
return {'OK', tonumber(n), fmt(fence), exp, seq, ts}
