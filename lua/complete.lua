-- mc_queue: complete
-- Record a running Attempt's success: only with the current fence and a live lease. The same
-- completion sent again (same fence, same result) is a no-op success; a different result with
-- the same fence is a conflict. Counts the finished Attempt (claim to end) in stats.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] counts     "<queue>|<state>" counters
-- KEYS[5] leases     lease expiry index
-- KEYS[6] task       task hash
-- KEYS[7] attempts   attempts hash
-- KEYS[8] events     task event stream
-- KEYS[9] stats      counters for metrics (refusals, expiries, decisions; here also the finished Attempt:
--                    fin|<queue>|<handler>|succeeded|<bucket>, fin_ms|<queue>|<handler>)
-- KEYS[10] fence     the task's fence counter
-- KEYS[11] lease     the task's lease key
-- KEYS[12] done      the queue's finished tasks (succeeded, canceled) -> when (ms)
-- KEYS[13] held      the queue's tasks waiting for a person (failed, blocked, quarantined)
-- KEYS[14] released  tasks that ended with dependents waiting (the sweeper's release.lua)
-- KEYS[15] slotheld  concurrency slots held (the Attempt's return: slots_free)
-- KEYS[16] slotwait  Attempts waiting for a slot (the first of a returned slot's key is woken)
-- KEYS[17] slotwake  waiters to wake (slot_wake.lua)
-- KEYS[18] spent     spend ceilings' reservations and buckets (the Attempt's reservation replaced by its spend)
-- ARGV[1] n              attempt number
-- ARGV[2] fence          fence the caller holds
-- ARGV[3] worker         worker id
-- ARGV[4] result         result JSON
-- ARGV[5] result_digest  sha256 of the canonical result
-- ARGV[6] cost           cost to add to what the Attempt was charged (plain decimal)
-- ARGV[7] tokens         tokens to add
-- ARGV[8] epoch
-- ARGV[9] min_seq
-- ARGV[10] proof         claim sequence of the fence when the caller's client was issued it, or ''
-- ARGV[11] snapshot      '1': the reply holds the task's Attempt fields (attempt_snapshot), '' not (a worker
--                        that only needs to know it was recorded: the snapshot is a third of this script's time)
-- Returns: {'OK', ended_at[, attempt_fields]} | {'DUP', ended_at[, attempt_fields]}
--          {'E_CONFLICT', recorded_digest}
--          {'E_STALE'|'E_STATE'|'E_EXPIRED', current_fence, attempt_state, lease_exp}
--          {'E_CANCELED', reason} (a cancel was requested: acknowledge instead)
--          {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_NONS', why} | {'E_BADARG', why}
-- Events: attempt_succeeded | completion_conflict | stale_write_refused
-- Idempotent: yes (fence + result digest)
--@include common
--@include fenced

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], counts = KEYS[4], leases = KEYS[5],
  task = KEYS[6], attempts = KEYS[7], events = KEYS[8], stats = KEYS[9], fence = KEYS[10], lease = KEYS[11],
  done = KEYS[12], held = KEYS[13], released = KEYS[14], slotheld = KEYS[15], slotwait = KEYS[16], slotwake = KEYS[17],
  spent = KEYS[18]}
bind_task(K)
local A, bad = args(ARGV, with({
  'n', 'int', 1, MAX_N,
  'fence', 'int', 0, MAX_INT,
  'worker', 'text', 200, false,
  'result', 'json', 524288, false,
  'result_digest', 'hex', 64, false,
  'cost', 'dec', 1e9, false,
  'tokens', 'int', 0, 1e12,
}, fenced_args(), {'snapshot', 'enum', '||1|', false}))
if bad then return bad end
local n = A.raw.n

local function done(code, ended_at)
  if A.snapshot == '1' then return {code, ended_at, attempt_snapshot(K.attempts, K.task, n)} end
  return {code, ended_at}
end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, A.min_seq, A.worker, true)
if err then return err end

-- (A hash of short fields is one listpack that every field read scans: a field it lacks costs a whole
-- scan. What only a replay or a task with limits needs is read only then.)
local a = redis.call('HMGET', K.attempts, n .. '.state', n .. '.fence', n .. '.started_at', n .. '.worker')
-- A replay only when the worker itself recorded this success with this fence (a reconciled one is settled
-- by 'reconcile'). A result of at most 64 bytes keeps no digest: it is the digest of the result kept.
if a[1] == 'succeeded' and a[2] == A.raw.fence then
  local d = redis.call('HMGET', K.attempts, n .. '.result_digest', n .. '.ended_at', n .. '.settled_by', n .. '.result')
  if not d[3] and (d[1] or d[4]) then
    local recorded = d[1] or sha256_hex(d[4])
    if recorded == A.result_digest then return done('DUP', d[2]) end
    return refuse(K.events, K.stats, 'completion_conflict', {'E_CONFLICT', recorded},
      {'attempt', n, 'worker', A.worker, 'fence', A.raw.fence, 'payload_digest', A.result_digest,
       'recorded_digest', recorded})
  end
end

local ts
err, ts = fence_check(K, A, A.worker, A.result_digest, 'complete', true)
if err then return err end

local t = redis.call('HMGET', K.task, 'queue', 'id', 'handler', 'fair_key', 'limits')
-- Slots and spend reservations come only from the task's limits (claim.lua), which never change.
local held = t[5] and redis.call('HMGET', K.attempts, n .. '.slots', n .. '.slots_at', n .. '.spend') or {}
local started = tonumber(a[3]) or ts
local ts_s = fmt(ts)
-- (The digest of a result of at most 64 bytes, kept whole, is not stored: readers compute it from the
-- result, mc_queue.contracts.models.filled_in; about 130 bytes less per finished task.)
-- Nor its elapsed time, ended_at less started_at (Attempt.from_fields), nor its claim's request id, which
-- only a resend of the claim while it runs reads (claim.lua).
aset(K.attempts, n, {'state', 'succeeded', 'ended_at', ts_s, 'result', A.result,
  unpack(#A.result > LONG_CHUNK and {'result_digest', A.result_digest} or {})})
redis.call('HDEL', K.attempts, n .. '.claim_req')
-- Nothing to add is not written (an Attempt without the field was charged 0, as renew leaves it).
if tonumber(A.cost) > 0 then redis.call('HINCRBYFLOAT', K.attempts, n .. '.cost', A.cost) end
if A.tokens > 0 then redis.call('HINCRBY', K.attempts, n .. '.tokens', A.raw.tokens) end
-- The result is the Attempt's, not copied into the task hash: readers take it from there (Task.from_redis).
redis.call('HSET', K.task, 'state', 'succeeded', 'active', '', 'updated_at', ts_s)
redis.call('ZREM', K.leases, t[2] .. '/' .. n)
redis.call('DEL', K.lease)
if held[1] then slots_free(K, n, t[2] .. '/' .. n, ts, held) end
if held[3] then spend_settle(K, n, t[2] .. '/' .. n, ts) end
move_count(K.counts, t[1], 'running', 'succeeded', K.task, t[4] or '')
index_end(K, t[2], 'running', 'succeeded', ts)
-- Compact ('~') when the worker and fence are the Attempt's own (the result digest always is): readers
-- fill them in (mc_queue.contracts.models.filled_in).
if A.worker == a[4] and A.raw.fence == a[2] then
  if imply(K.events, K.task, K.attempts, n, 'c') then  -- right after an implied claim: implied too
    redis.call('HSET', K.task, 'ev', 'cs')
  else
    emit(K.events, 'attempt_succeeded', {'attempt', n, '~', '1'})
  end
else
  emit(K.events, 'attempt_succeeded', {'attempt', n, 'worker', A.worker, 'fence', A.raw.fence, 'result_digest', A.result_digest})
end
observe(K.stats, t[3], 'fin', t[1], 'succeeded', ts - started)
return done('OK', ts_s)
