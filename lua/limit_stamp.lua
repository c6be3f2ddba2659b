-- mc_queue: limit_stamp
-- The tool gateway of a rate limit: the holder of a running Attempt is about to call the provider behind
-- one of its task's limits, and the units its claim took are counted from now instead of from the claim,
-- so a provider that counts calls sees no more than the limit in any window however long the Attempt took
-- to get to its call. Moving the entry later is safe while it is still in the window (every claim since
-- counted it); once it has left the window (a call more than a window after the claim) the units are
-- taken again as a claim takes them, or the call is refused until they return (E_LIMITED, nothing
-- written). Fenced: a stale holder's stamp is refused. A key with no limit set: nothing to do.
-- Its circuit breaker is checked before every call: open, no call (E_OPEN, with when it half-opens);
-- half-open, only the Attempts its claim admitted as probes call.
-- A fallback call (fallback_for: the primary key, whose breaker is down): the key must be one of the primary's
-- declared fallbacks ("<primary>|fallbacks") and the task must name both; the primary must be down now (open,
-- or half-open and this Attempt is not its probe), else NOOP and nothing written (call the primary). The
-- switch is recorded once per primary and fallback on the Attempt ('fallbacks': "<primary>><key>,...") and in
-- its history (fallback_used): a provider failover changes what the Attempt ran on, and that must show.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] task       task hash
-- KEYS[5] attempts   attempts hash
-- KEYS[6] events     task event stream
-- KEYS[7] stats      counters for metrics (refusals, expiries, decisions)
-- KEYS[8] fence      the task's fence counter
-- KEYS[9] lease      the task's lease key
-- KEYS[10] limits    rate limits: "<key>" -> "<limit> <window_ms> <source>", "<key>|used", ...
-- KEYS[11] log       the limit's admission log ("<attempt id> <cost>" -> ms)
-- ARGV[1] n          attempt number
-- ARGV[2] fence      fence the caller holds
-- ARGV[3] worker     worker id
-- ARGV[4] key        the rate limit's key (one the task names)
-- ARGV[5] epoch
-- ARGV[6] min_seq
-- ARGV[7] proof      claim sequence of the fence when the caller's client was issued it, or ''
-- ARGV[8] fallback_for  '' or the primary key this call stands in for (one the task names)
-- ARGV[9] skip       '1': the step calling the key is skipped (its last declared fallback is '-') instead of
--                    calling it, else ''; fallback_for must then be ''. Down now (as for a fallback call):
--                    recorded once on the Attempt ('fallbacks': "<key>>-") and in its history (step_skipped);
--                    up: NOOP, nothing written (call it)
-- Returns: {'OK', stamped_ms} (stamped_ms: '' when the key has no limit set)
--          {'NOOP', why} (a fallback call while its primary is up: nothing written)
--          {'E_LIMITED', why, due_ms} (its units left the window and others took them: call at due_ms)
--          {'E_OPEN', why, until_ms} (its circuit breaker is open, or half-open and this is no probe)
--          {'E_STALE'|'E_STATE'|'E_EXPIRED', current_fence, attempt_state, lease_exp}
--          {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_NONS', why} | {'E_BADARG', why}
-- Events: stale_write_refused | fallback_used | step_skipped
-- Idempotent: yes (a resend stamps the same entry again, later: still in its window)
--@include common
--@include fenced

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], task = KEYS[4], attempts = KEYS[5],
  events = KEYS[6], stats = KEYS[7], fence = KEYS[8], lease = KEYS[9], limits = KEYS[10], log = KEYS[11]}
bind_task(K)
local A, bad = args(ARGV, with({
  'n', 'int', 1, MAX_N,
  'fence', 'int', 0, MAX_INT,
  'worker', 'text', 200, false,
  'key', 'lkey', false, false,
}, fenced_args(), {'fallback_for', 'text', 128, false, 'skip', 'enum', '||1|', false}))
if bad then return bad end
if A.skip == '1' and A.fallback_for ~= '' then return {'E_BADARG', 'skip is for the key itself: fallback_for must be empty'} end
if string.sub(K.log, -(#A.key + 7)) ~= ':limit:' .. A.key then return {'E_BADARG', 'log is not the log of ' .. A.key} end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, A.min_seq, A.worker, true)
if err then return err end
local t = redis.call('HMGET', K.task, 'id', 'limits')
if not t[1] then return {'E_NOTASK', 'no such task'} end
local cost, primary = nil, nil
for _, w in ipairs(parse_limits(t[2] or '') or {}) do
  if w[1] == A.key then cost = w[2] end
  if w[1] == A.fallback_for then primary = true end
end
if not cost then return {'E_BADARG', 'the task names no rate limit ' .. A.key .. ' (its limits: ' .. (t[2] or 'none') .. ')'} end
if A.fallback_for ~= '' and not primary then
  return {'E_BADARG', 'fallback_for: the task names no key ' .. A.fallback_for .. ' (its limits: ' .. (t[2] or 'none') .. ')'}
end
local ts
err, ts = fence_check(K, A, A.worker, '', 'limit_stamp', false)
if err then return err end

local c = redis.call('HMGET', K.limits, A.key, A.key .. '|used', A.key .. '|bstate', A.key .. '|bwhy', A.key .. '|fallbacks')
local probes = ',' .. (aget(K.attempts, A.raw.n, 'probe') or '') .. ','
-- Whether a key's circuit breaker keeps this Attempt from calling it ('open' with its time to run, or
-- 'half' since a claim admitted probes, or 'open' with its time run out before a claim turned it half-open:
-- any breaker state is down for an Attempt that is not one of its probes; open with time to run is down
-- for a probe too). The one answer for a direct call (E_OPEN), a skip and a fallback call. Returns down,
-- and the open state's end when it still has time to run.
local function breaker_down(bstate, key)
  local kind, until_ms = string.match(bstate or '', '^(%a+) (%d+)')
  if not kind then return false, nil end
  local open_until = (kind == 'open' and tonumber(until_ms) > ts) and until_ms or nil
  return open_until ~= nil or not string.find(probes, ',' .. key .. ',', 1, true), open_until
end
local down, open_until = breaker_down(c[3], A.key)
if A.skip == '1' then  -- an optional step: skipped only when declared so and the key is down now
  local declared = string.match(c[5] or '', '^(%S+)') or ''
  if not string.find(',' .. declared .. ',', ',-,', 1, true) then
    return {'E_BADARG', A.key .. ' declares no skip (its fallbacks: ' .. (declared ~= '' and declared or 'none') ..
      '): declare it with App.optional'}
  end
  if not down then return {'NOOP', 'the breaker of ' .. A.key .. ' is not open: call it'} end
  local had = aget(K.attempts, A.raw.n, 'fallbacks') or ''
  if not string.find(',' .. had .. ',', ',' .. A.key .. '>-,', 1, true) then
    aset(K.attempts, A.raw.n, {'fallbacks', had == '' and (A.key .. '>-') or (had .. ',' .. A.key .. '>-')})
    emit(K.events, 'step_skipped', {'attempt', A.raw.n, 'worker', A.worker, 'key', A.key,
      'why', c[4] or 'its circuit breaker is open'})
  end
  return {'OK', ''}
end
if open_until then
  return {'E_OPEN', 'circuit breaker ' .. A.key .. ' is open until ' .. open_until .. ' ms (Redis clock): ' ..
    (c[4] or ''), open_until}
end
if down then
  return {'E_OPEN', 'circuit breaker ' .. A.key .. ' is half-open: only its probe Attempts call it', fmt(ts + 250)}
end
local switch = nil  -- a fallback call: the key must be declared for the primary, and the primary down now
if A.fallback_for ~= '' then
  local p = redis.call('HMGET', K.limits, A.fallback_for .. '|fallbacks', A.fallback_for .. '|bstate')
  local declared = string.match(p[1] or '', '^(%S+)') or ''
  if not string.find(',' .. declared .. ',', ',' .. A.key .. ',', 1, true) then
    return {'E_BADARG', A.key .. ' is not a declared fallback of ' .. A.fallback_for .. ' (its fallbacks: ' ..
      (declared ~= '' and declared or 'none') .. ')'}
  end
  if not breaker_down(p[2], A.fallback_for) then
    return {'NOOP', 'the breaker of ' .. A.fallback_for .. ' is not open: call it'}
  end
  switch = A.fallback_for .. '>' .. A.key
end
-- (a fallback call goes ahead: recorded once per primary and fallback, with why the primary is down)
local function switched(reply)
  local had = aget(K.attempts, A.raw.n, 'fallbacks') or ''
  if switch and not string.find(',' .. had .. ',', ',' .. switch .. ',', 1, true) then
    aset(K.attempts, A.raw.n, {'fallbacks', had == '' and switch or (had .. ',' .. switch)})
    emit(K.events, 'fallback_used', {'attempt', A.raw.n, 'worker', A.worker, 'from', A.fallback_for, 'to', A.key,
      'why', redis.call('HGET', K.limits, A.fallback_for .. '|bwhy') or 'its circuit breaker is open'})
  end
  return reply
end
local lim, win = string.match(c[1] or '', '^(%d+) (%d+)')
lim, win = tonumber(lim), tonumber(win)
if not lim or cost == 0 then return switched({'OK', ''}) end
local member = t[1] .. '/' .. A.raw.n .. ' ' .. cost
local at = tonumber(redis.call('ZSCORE', K.log, member) or '')
local ts_s = fmt(ts)
if at and at > ts - win then  -- still in the window: counted from now
  redis.call('ZADD', K.log, 'XX', ts_s, member)
  redis.call('PEXPIRE', K.log, win + 1000)
  return switched({'OK', ts_s})
end
-- Its units left the window (or its log was dropped): take them again, as a claim would.
local inwin, old = window_units(K, tonumber(c[2] or '0') or 0, win, ts)
if inwin + cost > lim then
  local first = redis.call('ZRANGEBYSCORE', K.log, '(' .. fmt(ts - win), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  local due = first[2] and (tonumber(first[2]) + win) or (ts + win)
  return {'E_LIMITED', 'rate limit ' .. A.key .. ': ' .. inwin .. ' of ' .. lim .. ' units used in the last ' ..
    win .. ' ms, ' .. cost .. ' wanted (this call came more than a window after its claim)', fmt(due)}
end
window_take(K, A.key, member, cost, inwin, old, win, ts)
return switched({'OK', ts_s})
