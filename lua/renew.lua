-- mc_queue: renew
-- Extend the lease of a running Attempt (a heartbeat), and charge cost and tokens to it: only
-- with the current fence and a live lease.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] leases     lease expiry index
-- KEYS[5] task       task hash
-- KEYS[6] attempts   attempts hash
-- KEYS[7] events     task event stream
-- KEYS[8] stats      counters for metrics (refusals, expiries, decisions)
-- ARGV[1] n          attempt number
-- ARGV[2] fence      fence the caller holds
-- ARGV[3] worker     worker id
-- ARGV[4] lease_ms   new lease length from now, or '' for the length granted at claim
-- ARGV[5] epoch
-- ARGV[6] min_seq
-- ARGV[7] cost       cost to charge to the Attempt now (decimal string, '0' for none)
-- ARGV[8] tokens     tokens to charge now
-- ARGV[9] request_id a charge is applied once per request id
-- Returns: {'OK', lease_exp_ms, cancel_requested('0'|'1'), attempt_cost, attempt_tokens}
--          {'E_STALE'|'E_STATE'|'E_EXPIRED', current_fence, attempt_state, lease_exp}
--          {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_BADARG', why}
-- Events: stale_write_refused on refusal (a successful renewal updates hb_at, no event)
-- Idempotent: yes (a resend extends the same lease again; a charge applies once per request id)
--@include common

local k_meta, k_epochs, k_nslog, k_leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local k_task, k_att, k_ev = KEYS[5], KEYS[6], KEYS[7]
local k_stats = KEYS[8]
local n, fence, worker, lease_ms, epoch, min_seq = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6]
local cost, tokens = tonumber(ARGV[7]), tonumber(ARGV[8])
if not cost or not tokens or cost < 0 or tokens < 0 then return {'E_BADARG', 'cost and tokens must be >= 0'} end
if ARGV[4] ~= '' and (not lease_ms or lease_ms < 1 or lease_ms ~= math.floor(lease_ms)) then
  return {'E_BADARG', 'lease_ms must be a positive integer'}
end
-- Namespace and fence first: after Redis lost its data the stored lease length is gone too, and
-- the loss must be reported as a loss, not as a bad argument.
local err = ns_check(k_meta, k_epochs, k_nslog, epoch, min_seq, worker, true)
if err then return err end
if ARGV[4] == '' then lease_ms = tonumber(redis.call('HGET', k_att, n .. '.lease_ms') or '') end
local ts = now_ms()
err = fence_check(k_meta, k_nslog, k_stats, k_task, k_att, k_ev, n, fence, worker,
  'renew:' .. (lease_ms and fmt(lease_ms) or ''), 'renew', ts)
if err then return err end
if not lease_ms or lease_ms < 1 then return {'E_BADARG', 'lease_ms must be a positive integer'} end
local exp = ts + lease_ms
aset(k_att, n, {'lease_exp', exp, 'hb_at', ts})
redis.call('ZADD', k_leases, exp, redis.call('HGET', k_task, 'id') .. '/' .. n)
local req = ARGV[9]
if (cost > 0 or tokens > 0) and (req == '' or aget(k_att, n, 'charge_req') ~= req) then
  redis.call('HINCRBYFLOAT', k_att, n .. '.cost', ARGV[7])
  redis.call('HINCRBY', k_att, n .. '.tokens', tokens)
  if req ~= '' then aset(k_att, n, {'charge_req', req}) end
end
local total_cost = aget(k_att, n, 'cost') or '0'
local total_tokens = aget(k_att, n, 'tokens') or '0'
local cancel = redis.call('HGET', k_task, 'cancel_requested') and '1' or '0'
return {'OK', exp, cancel, total_cost, total_tokens}
