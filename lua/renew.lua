-- mc_queue: renew
-- Extend the lease of a running Attempt (a heartbeat: PEXPIREAT of its lease key), and charge cost and
-- tokens to it: only with the current fence and a live lease. An Attempt with a timeout budget (its
-- 'deadline', set by the claim) is never renewed past one lease length after it (the time to stop the
-- handler and record why): its last renewals are cut to that, and one after it is refused (E_EXPIRED,
-- refusal 'budget_spent'). A worker enforces the budget itself; this holds a handler that hangs where the
-- worker cannot stop it while its heartbeat thread still beats.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] leases     lease expiry index
-- KEYS[5] task       task hash
-- KEYS[6] attempts   attempts hash
-- KEYS[7] events     task event stream
-- KEYS[8] stats      counters for metrics (refusals, expiries, decisions)
-- KEYS[9] fence      the task's fence counter
-- KEYS[10] lease     the task's lease key
-- ARGV[1] n          attempt number
-- ARGV[2] fence      fence the caller holds
-- ARGV[3] worker     worker id
-- ARGV[4] lease_ms   new lease length from now, or '' for the length granted at claim
-- ARGV[5] cost       cost to charge to the Attempt now (plain decimal, '0' for none)
-- ARGV[6] tokens     tokens to charge now
-- ARGV[7] request_id a charge is applied once per request id
-- ARGV[8] epoch
-- ARGV[9] min_seq
-- ARGV[10] proof     claim sequence of the fence when the caller's client was issued it, or ''
-- Returns: {'OK', lease_exp_ms, cancel_requested('0'|'1'), attempt_cost, attempt_tokens}
--          {'E_STALE'|'E_STATE'|'E_EXPIRED', current_fence, attempt_state, lease_exp}
--          {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_NONS', why} | {'E_BADARG', why}
-- Events: stale_write_refused on refusal (a successful renewal updates hb_at, no event)
-- Idempotent: yes (a resend extends the same lease again; a charge applies once per request id)
--@include common
--@include fenced

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], leases = KEYS[4], task = KEYS[5],
  attempts = KEYS[6], events = KEYS[7], stats = KEYS[8], fence = KEYS[9], lease = KEYS[10]}
bind_task(K)
local A, bad = args(ARGV, with({
  'n', 'int', 1, MAX_N,
  'fence', 'int', 0, MAX_INT,
  'worker', 'text', 200, false,
  'lease_ms', 'int?', 1, MAX_INT,
  'cost', 'dec', 1e9, false,
  'tokens', 'int', 0, 1e12,
  'request_id', 'reqid', false, false,
}, fenced_args()))
if bad then return bad end
local m = meta_read(K.meta, true)
if A.lease_ms and A.lease_ms > m.max_lease then
  return {'E_BADARG', 'lease_ms ' .. fmt(A.lease_ms) .. ' is above the namespace ceiling of ' .. fmt(m.max_lease) .. ' ms'}
end
local n = A.raw.n
local err, ts, cancel_reason = fenced(K, A, A.worker, 'renew:' .. (A.lease_ms and fmt(A.lease_ms) or ''), 'renew',
  false)
if err then return err end
-- (one read: what decides the lease, and the charges so far, which the reply reports)
local own = redis.call('HMGET', K.attempts, n .. '.lease_ms', n .. '.deadline', n .. '.cost', n .. '.tokens')
local lease_ms = A.lease_ms or math.min(tonumber(own[1] or '') or m.max_lease, m.max_lease)
local exp = ts + lease_ms
local deadline = tonumber(own[2] or '')
if deadline then
  local last = deadline + (tonumber(own[1] or '') or lease_ms)
  if ts >= last then
    return refuse(K.events, K.stats, 'stale_write_refused',
      {'E_EXPIRED', A.raw.fence, 'running', aget(K.attempts, n, 'lease_exp') or ''},
      {'attempt', n, 'op', 'renew', 'refusal', 'budget_spent', 'presented_fence', A.raw.fence, 'current_fence',
       A.raw.fence, 'worker', A.worker, 'deadline', fmt(deadline), 'attempt_state', 'running'})
  end
  if exp > last then exp = last end
end
redis.call('PEXPIREAT', K.lease, exp)
aset(K.attempts, n, {'lease_exp', exp, 'hb_at', ts})
redis.call('ZADD', K.leases, exp, redis.call('HGET', K.task, 'id') .. '/' .. n)
local total_cost, total_tokens = own[3] or '0', own[4] or '0'
if (tonumber(A.cost) > 0 or A.tokens > 0) and (A.request_id == '' or aget(K.attempts, n, 'charge_req') ~= A.request_id) then
  total_cost = redis.call('HINCRBYFLOAT', K.attempts, n .. '.cost', A.cost)
  total_tokens = tostring(redis.call('HINCRBY', K.attempts, n .. '.tokens', A.tokens))
  if A.request_id ~= '' then aset(K.attempts, n, {'charge_req', A.request_id}) end
end
local cancel = cancel_reason and '1' or '0'
return {'OK', exp, cancel, total_cost, total_tokens}
