-- mc_queue: breaker_record
-- The outcome of one call to a dependency with a circuit breaker ('ok' or 'fail', and how long it took),
-- recorded by the worker that made it (ctx.call). Closed: counted in the breaker's window (ten buckets,
-- a hash per key), and the breaker opens for its open time when, over at least 'min calls' in the window,
-- the share of failures reaches its failure rate, the share of calls slower than 'slow ms' its slow rate,
-- or one failure fingerprint repeats 'same failure' times (the seed's failure fingerprint counter). Half-
-- open: a probe's failure (or slow call) opens it again at once; once every probe succeeded it closes,
-- its window cleared. Open: a late outcome of a call admitted before it opened is not counted. Each
-- transition is in the namespace log and counted for metrics.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] limits     rate limits and breakers: "<key>|breaker" (setting), "<key>|bstate", "<key>|bwhy"
-- KEYS[5] stats      counters for metrics (breaker_opened|<key>, breaker_closed|<key>, breaker_calls|<key>|<outcome>)
-- KEYS[6] window     the breaker's window: "<bucket ms>|calls", "|fails", "|slow", "|fp:<fingerprint>" -> count
-- ARGV[1] epoch
-- ARGV[2] actor      the worker
-- ARGV[3] key        the dependency's key
-- ARGV[4] outcome    'ok' | 'fail'
-- ARGV[5] elapsed_ms how long the call took
-- ARGV[6] fingerprint the failure's fingerprint (16 hex digits), or ''
-- ARGV[7] attempt    the Attempt that made the call (for the log)
-- Returns: {'OK', state} (state after it: closed | open | half) | {'NOOP', why} (no breaker set, or it is open)
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events (nslog): breaker_opened | breaker_closed
-- Idempotent: no (each call counts once: the worker sends it once, on a connection that does not resend)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], limits = KEYS[4], stats = KEYS[5], window = KEYS[6]}
local A, bad = args(ARGV, {
  'epoch', 'epoch', false, false,
  'actor', 'id', 200, false,
  'key', 'lkey', false, false,
  'outcome', 'enum', '|ok|fail|', false,
  'elapsed_ms', 'int', 0, MAX_INT,
  'fingerprint', 'hex?', 16, false,
  'attempt', 'id', 200, false,
})
if bad then return bad end
if string.sub(K.window, -(#A.key + 9)) ~= ':breaker:' .. A.key then
  return {'E_BADARG', 'window is not the window of breaker ' .. A.key}
end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end

local c = redis.call('HMGET', K.limits, A.key .. '|breaker', A.key .. '|bstate')
local b = breaker_setting(c[1])
if not b then return {'NOOP', 'no circuit breaker ' .. A.key} end
local rate, min_calls, win, open_ms = b.rate, b.min_calls, b.win, b.open_ms
local probes, slow_ms, slow_rate, same = b.probes, b.slow_ms, b.slow_rate, b.same
local ts = now_ms()
local slow = slow_ms > 0 and A.elapsed_ms >= slow_ms
local bad_call = A.outcome == 'fail' or slow
redis.call('HINCRBY', K.stats, 'breaker_calls|' .. A.key .. '|' .. (A.outcome == 'fail' and 'fail' or
  (slow and 'slow' or 'ok')), 1)

local function open(why)
  local untl = fmt(ts + open_ms)
  redis.call('HSET', K.limits, A.key .. '|bstate', 'open ' .. untl, A.key .. '|bwhy', why)
  redis.call('DEL', K.window)
  redis.call('HINCRBY', K.stats, 'breaker_opened|' .. A.key, 1)
  emit(K.nslog, 'breaker_opened', {'key', A.key, 'until', untl, 'reason', why, 'attempt', A.attempt, 'actor', A.actor})
  return {'OK', 'open'}
end

local kind, b1, b2, b3 = string.match(c[2] or '', '^(%a+) (%d+) ?(%d*) ?(%d*)$')
if kind == 'open' then return {'NOOP', 'breaker ' .. A.key .. ' is open: a late outcome is not counted'} end
if kind == 'half' then
  if bad_call then
    return open('a probe ' .. (slow and 'took ' .. A.elapsed_ms .. ' ms' or 'failed') .. ' (attempt ' .. A.attempt .. ')')
  end
  local ok = (tonumber(b2) or 0) + 1
  if ok < probes then
    redis.call('HSET', K.limits, A.key .. '|bstate', 'half ' .. b1 .. ' ' .. ok .. ' ' .. b3)
    return {'OK', 'half'}
  end
  redis.call('HDEL', K.limits, A.key .. '|bstate')
  redis.call('DEL', K.window)
  redis.call('HINCRBY', K.stats, 'breaker_closed|' .. A.key, 1)
  emit(K.nslog, 'breaker_closed', {'key', A.key, 'reason', ok .. ' probe(s) succeeded', 'actor', A.actor})
  return {'OK', 'closed'}
end

-- Closed: count it in its bucket (a tenth of the window), drop the buckets that left the window, add up.
local step = math.max(1, math.floor(win / 10))
local bucket = fmt(ts - ts % step)
redis.call('HINCRBY', K.window, bucket .. '|calls', 1)
if A.outcome == 'fail' then redis.call('HINCRBY', K.window, bucket .. '|fails', 1) end
if slow then redis.call('HINCRBY', K.window, bucket .. '|slow', 1) end
if A.outcome == 'fail' and A.fingerprint ~= '' then redis.call('HINCRBY', K.window, bucket .. '|fp:' .. A.fingerprint, 1) end
redis.call('PEXPIRE', K.window, win + step)
local all = redis.call('HGETALL', K.window)
local calls, fails, slows, fps, gone = 0, 0, 0, {}, {}
for i = 1, #all, 2 do
  local b, what = string.match(all[i], '^(%d+)|(.+)$')
  local v = tonumber(all[i + 1]) or 0
  if b and tonumber(b) + step <= ts - win then
    gone[#gone + 1] = all[i]
  elseif what == 'calls' then calls = calls + v
  elseif what == 'fails' then fails = fails + v
  elseif what == 'slow' then slows = slows + v
  elseif what and string.sub(what, 1, 3) == 'fp:' then fps[what] = (fps[what] or 0) + v
  end
end
if #gone > 0 then redis.call('HDEL', K.window, unpack(gone)) end
if calls >= min_calls and fails * 100 >= rate * calls then
  return open(fails .. ' of ' .. calls .. ' calls failed in the last ' .. win .. ' ms (opens at ' .. rate .. '%)')
end
if slow_ms > 0 and calls >= min_calls and slows * 100 >= slow_rate * calls then
  return open(slows .. ' of ' .. calls .. ' calls took ' .. slow_ms .. ' ms or more in the last ' .. win ..
    ' ms (opens at ' .. slow_rate .. '%)')
end
if same > 0 and A.fingerprint ~= '' and (fps['fp:' .. A.fingerprint] or 0) >= same then
  return open('the same failure (' .. A.fingerprint .. ') ' .. fps['fp:' .. A.fingerprint] ..
    ' times in the last ' .. win .. ' ms')
end
return {'OK', 'closed'}
