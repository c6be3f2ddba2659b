-- mc_queue: limit_admin
-- Set, delete, pause or resume a rate limit ('<limit> units per <window_ms>' of a key such as 'github' or
-- 'model:openai', checked and taken by each claim of a task that names the key: lua/claim.lua). A pause
-- holds every claim of the key until its end (a provider's 429 with Retry-After, paused fleet-wide by the
-- worker that saw it, or an operator); pausing a paused key keeps the later end. An App's limit ('app')
-- does not replace one an operator set ('operator'): that is NOOP. Each change is recorded in the
-- namespace log with who and why; no task changes state.
-- A circuit breaker of the same key: 'breaker' sets it ("<failure %> <min calls> <window ms> <open ms> <probes>
-- <slow ms> <slow %> <same failure>": breaker_record.lua), 'trip' opens it by hand for for_ms (until then no
-- task naming the key is claimed; then half-open), 'reset' closes it by hand (its window cleared).
-- Concurrency slots of the key (a bulkhead: 'slots' sets "<slots> <on full> <source>", 'unslots' deletes it):
-- at most that many running Attempts of tasks naming the key (claim.lua); the key may be a family, '<name>:*',
-- giving each key '<name>:...' its own slots. A change wakes the key's waiters at the sweeper's next audit
-- (slot_audit.lua). The key's writer fence is never deleted (a provider keeps the highest it saw).
-- A spend ceiling of the key (denial of wallet: 'spend' sets "<cost thousandths> <tokens> <window ms> <on over>
-- <source>", 'unspend' deletes it): what the running and recently ended Attempts of tasks naming the key may
-- spend per window (claim.lua); a family '<name>:*' gives each key '<name>:...' its own ceiling. 'delete' drops
-- every setting of the key (rate limit, pause, breaker, slots, ceiling, fallbacks, weight).
-- A fair share of the key ('weight' sets "<weight> <source>", 1..1000; 'unweight' deletes it): how many messages of
-- its tasks' fair lanes a worker takes for one of a key of weight 1 while both have a backlog (fair_pop.lua); a
-- family '<name>:*' gives each key '<name>:...' that weight.
-- Declared fallbacks of the key ('fallbacks' sets "<fallback key>,... <source>", in the order they are tried;
-- 'unfallbacks' deletes them): while the key's breaker is down, a task that names one of them too is claimed
-- and its call goes there (claim.lua, limit_stamp.lua).
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] limits     rate limits: "<key>" -> "<limit> <window_ms> <source>", "<key>|used", "<key>|paused",
--                    "<key>|why", "<key>|next", "<key>|breaker", "<key>|bstate", "<key>|bwhy", "<key>|slots",
--                    "<key>|spend", "<key>|snext", "<key>|fallbacks", "<key>|weight"
-- KEYS[5] log        the key's admission log (delete drops it)
-- KEYS[6] window     the key's circuit breaker window (delete and reset clear it)
-- ARGV[1] epoch
-- ARGV[2] actor
-- ARGV[3] op         'set' | 'delete' | 'pause' | 'resume' | 'breaker' | 'trip' | 'reset' | 'slots' | 'unslots' |
--                    'spend' | 'unspend' | 'fallbacks' | 'unfallbacks' | 'weight' | 'unweight'
-- ARGV[4] key        the limit's key (for slots, unslots, spend, unspend, weight and unweight also a family:
--                    '<name>:*')
-- ARGV[5] limit      units admitted per window (set), the concurrency slots (slots, 1..1000000), the cost
--                    ceiling in thousandths (spend; '' for none), or the fair share (weight, 1..1000), else ''
-- ARGV[6] window_ms  the sliding window (set, spend; at most 30 days), else ''
-- ARGV[7] for_ms     how long a pause or a trip holds, from now on Redis's clock (at most 30 days), else ''
-- ARGV[8] source     'operator' | 'app' | 'worker': who sets it
-- ARGV[9] reason     why, recorded (a pause's or a trip's reason is what deferred claims say)
-- ARGV[10] breaker   the breaker's setting (breaker), else ''
-- ARGV[11] on_full   what a claim does when the key's slots are all held (slots): 'wait' | 'reject' |
--                    'supersede'; or when the key's spend ceiling is reached (spend): 'wait' | 'reject'; else ''
-- ARGV[12] tokens    the tokens ceiling (spend; '' for none), else ''
-- ARGV[13] fallbacks the key's fallbacks, in order: keys joined by ',' (fallbacks; at most 8; the last may be
--                    '-': the step calling the key can be skipped while it is down), else ''
-- Returns: {'OK', op, at_ms} (for a pause: {'OK', 'pause', paused_until_ms}; for a trip, when it half-opens)
--          | {'NOOP', why}
--          {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events (nslog): limit_set | limit_deleted | limit_paused | limit_resumed | breaker_set | breaker_opened |
--                 breaker_closed | slots_set | slots_deleted | spend_set | spend_deleted | fallbacks_set |
--                 fallbacks_deleted | weight_set | weight_deleted
-- Idempotent: yes (a second run finds the limit already so; a pause keeps the later end)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], limits = KEYS[4], log = KEYS[5], window = KEYS[6]}
local MAX_WINDOW_MS = 2592000000
local A, bad = args(ARGV, {
  'epoch', 'epoch', false, false,
  'actor', 'id', 200, false,
  'op', 'enum', '|set|delete|pause|resume|breaker|trip|reset|slots|unslots|spend|unspend|fallbacks|unfallbacks|weight|unweight|', false,
  'key', 'text', 130, false,
  'limit', 'int?', 1, 999999999,
  'window_ms', 'int?', 1, MAX_WINDOW_MS,
  'for_ms', 'int?', 1, MAX_WINDOW_MS,
  'source', 'enum', '|operator|app|worker|', false,
  'reason', 'text', 2000, false,
  'breaker', 'text', 200, false,
  'on_full', 'enum', '||wait|reject|supersede|', false,
  'tokens', 'int?', 1, 999999999999999,
  'fallbacks', 'text', 1040, false,
})
if bad then return bad end
local family = (A.op == 'slots' or A.op == 'unslots' or A.op == 'spend' or A.op == 'unspend' or A.op == 'weight' or
  A.op == 'unweight') and
  string.match(A.key, '^(.+:)%*$') or nil
local base = family or A.key
if #base > 128 or not string.find(base, '^[%w][%w_%.:%-]*$') then
  return {'E_BADARG', "key must be 1-128 of letters, digits, '_', '.', ':', '-', starting with a letter or digit" ..
    " (for slots, spend and weight also '<name>:*', a family)"}
end
if string.sub(K.window, -(#base + 9)) ~= ':breaker:' .. base then
  return {'E_BADARG', 'window is not the window of breaker ' .. base}
end
local spend = A.op == 'spend'
if (A.op == 'slots' or spend) ~= (A.on_full ~= '') then
  return {'E_BADARG', 'on_full is for slots and spend, and each needs it'}
end
if spend and A.on_full == 'supersede' then return {'E_BADARG', "a spend ceiling's on_full is wait or reject"} end
if spend and not (A.window_ms and (A.limit or A.tokens)) then
  return {'E_BADARG', 'spend needs a window_ms and a cost ceiling (limit, thousandths) or a tokens ceiling'}
end
if A.tokens and not spend then return {'E_BADARG', 'tokens is for spend only'} end
if (A.op == 'fallbacks') ~= (A.fallbacks ~= '') then
  return {'E_BADARG', 'fallbacks is for op fallbacks, and that op needs it'}
end
if A.op == 'fallbacks' then
  local seen, count, skip = {[A.key] = true}, 0, false
  for fb in string.gmatch(A.fallbacks .. ',', '([^,]*),') do
    count = count + 1
    if skip or (fb ~= '-' and (#fb > 128 or not string.find(fb, '^[%w][%w_%.:%-]*$'))) or seen[fb] or count > 8 then
      return {'E_BADARG', "fallbacks must be 1-8 distinct keys joined by ',', none the key itself (letters, digits, " ..
        "'_', '.', ':', '-'), the last of them may be '-' (the step can be skipped)"}
    end
    seen[fb], skip = true, fb == '-'
  end
end
if A.op == 'weight' and (not A.limit or A.limit > 1000) then
  return {'E_BADARG', 'weight needs a limit: the fair share of the key, 1..1000'}
end
if A.op == 'slots' and (not A.limit or A.limit > 1000000) then
  return {'E_BADARG', 'slots needs a limit: the running Attempts the key admits, 1..1000000'}
end
local cfg = {string.match(A.breaker, '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')}
if A.op == 'breaker' then
  local names = {'failure %', 'min calls', 'window ms', 'open ms', 'probes', 'slow ms', 'slow %', 'same failure'}
  local lows = {1, 1, 1, 1, 1, 0, 1, 0}
  local highs = {100, 1000000, MAX_WINDOW_MS, MAX_WINDOW_MS, 1000, MAX_WINDOW_MS, 100, 1000000}
  if #cfg ~= 8 then return {'E_BADARG', 'breaker must be 8 whole numbers: ' .. table.concat(names, ', ')} end
  for i = 1, 8 do
    local v = tonumber(cfg[i])
    if #cfg[i] > 12 or v < lows[i] or v > highs[i] then
      return {'E_BADARG', 'breaker ' .. names[i] .. ' must be between ' .. lows[i] .. ' and ' .. fmt(highs[i])}
    end
  end
elseif A.breaker ~= '' then
  return {'E_BADARG', 'breaker is for op breaker only'}
end
if string.sub(K.log, -(#base + 7)) ~= ':limit:' .. base then return {'E_BADARG', 'log is not the log of ' .. base} end
if A.op == 'set' and not (A.limit and A.window_ms) then return {'E_BADARG', 'set needs a limit and a window_ms'} end
if (A.op == 'pause' or A.op == 'trip') and not A.for_ms then return {'E_BADARG', A.op .. ' needs for_ms'} end
if A.op ~= 'set' and not spend and (A.op ~= 'slots' and A.op ~= 'weight' and A.limit or A.window_ms) then
  return {'E_BADARG', 'limit and window_ms are for set and spend only (limit also for slots and weight)'}
end
if A.op ~= 'pause' and A.op ~= 'trip' and A.for_ms then return {'E_BADARG', 'for_ms is for pause and trip only'} end
if A.reason == '' then return {'E_BADARG', 'reason: say why (it is recorded)'} end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end

local ts = now_ms()
local c = redis.call('HMGET', K.limits, A.key, A.key .. '|paused', A.key .. '|breaker', A.key .. '|bstate',
  A.key .. '|slots', A.key .. '|spend', A.key .. '|fallbacks', A.key .. '|weight')
local lim, win, source = string.match(c[1] or '', '^(%d+) (%d+) (%S+)$')
local ev = {'key', A.key, 'actor', A.actor, 'reason', A.reason, 'source', A.source}
if A.op == 'set' then
  local value = A.raw.limit .. ' ' .. A.raw.window_ms .. ' ' .. A.source
  if source == 'operator' and A.source == 'app' then
    return {'NOOP', 'an operator set limit ' .. A.key .. ' (' .. lim .. ' per ' .. win .. ' ms): the App does not replace it'}
  end
  if c[1] == value then return {'NOOP', 'limit ' .. A.key .. ' is already ' .. lim .. ' per ' .. win .. ' ms'} end
  redis.call('HSET', K.limits, A.key, value)
  emit(K.nslog, 'limit_set', {'limit', A.raw.limit, 'window_ms', A.raw.window_ms, unpack(ev)})
  return {'OK', 'set', ts}
elseif A.op == 'slots' then
  local value = A.raw.limit .. ' ' .. A.on_full .. ' ' .. A.source
  local _, _, was = string.match(c[5] or '', '^(%d+) (%a+) (%a+)$')
  if was == 'operator' and A.source == 'app' then
    return {'NOOP', 'an operator set the slots of ' .. A.key .. ' (' .. c[5] .. '): the App does not replace them'}
  end
  if c[5] == value then return {'NOOP', A.key .. ' has ' .. A.raw.limit .. ' slots (' .. A.on_full .. ') already'} end
  redis.call('HSET', K.limits, A.key .. '|slots', value)
  emit(K.nslog, 'slots_set', {'slots', A.raw.limit, 'on_full', A.on_full, unpack(ev)})
  return {'OK', 'slots', ts}
elseif A.op == 'weight' then
  local value = A.raw.limit .. ' ' .. A.source
  if string.match(c[8] or '', ' (%a+)$') == 'operator' and A.source == 'app' then
    return {'NOOP', 'an operator set the weight of ' .. A.key .. ' (' .. c[8] .. '): the App does not replace it'}
  end
  if c[8] == value then return {'NOOP', A.key .. ' has weight ' .. A.raw.limit .. ' already'} end
  redis.call('HSET', K.limits, A.key .. '|weight', value)
  emit(K.nslog, 'weight_set', {'weight', A.raw.limit, unpack(ev)})
  return {'OK', 'weight', ts}
elseif A.op == 'unweight' then
  if not c[8] then return {'NOOP', 'no weight set for ' .. A.key} end
  redis.call('HDEL', K.limits, A.key .. '|weight')
  emit(K.nslog, 'weight_deleted', ev)
  return {'OK', 'unweight', ts}
elseif A.op == 'unslots' then
  if not c[5] then return {'NOOP', 'no slots set for ' .. A.key} end
  redis.call('HDEL', K.limits, A.key .. '|slots')
  emit(K.nslog, 'slots_deleted', ev)
  return {'OK', 'unslots', ts}
elseif spend or A.op == 'fallbacks' then
  local field, had, what, value, extra = '|fallbacks', c[7], 'the fallbacks', A.fallbacks .. ' ' .. A.source,
    {'fallbacks', A.fallbacks}
  if spend then
    field, had, what = '|spend', c[6], 'the spend ceiling'
    value = (A.raw.limit ~= '' and A.raw.limit or '0') .. ' ' .. (A.raw.tokens ~= '' and A.raw.tokens or '0') ..
      ' ' .. A.raw.window_ms .. ' ' .. A.on_full .. ' ' .. A.source
    extra = {'cost', A.raw.limit, 'tokens', A.raw.tokens, 'window_ms', A.raw.window_ms, 'on_over', A.on_full}
  end
  if string.match(had or '', ' (%a+)$') == 'operator' and A.source == 'app' then
    return {'NOOP', 'an operator set ' .. what .. ' of ' .. A.key .. ' (' .. had .. '): the App does not replace it'}
  end
  if had == value then return {'NOOP', what .. ' of ' .. A.key .. ' is ' .. value .. ' already'} end
  redis.call('HSET', K.limits, A.key .. field, value)
  for _, v in ipairs(ev) do extra[#extra + 1] = v end
  emit(K.nslog, spend and 'spend_set' or 'fallbacks_set', extra)
  return {'OK', A.op, ts}
elseif A.op == 'unfallbacks' or A.op == 'unspend' then
  local field = A.op == 'unspend' and '|spend' or '|fallbacks'
  if not (A.op == 'unspend' and c[6] or A.op == 'unfallbacks' and c[7]) then
    return {'NOOP', 'no ' .. string.sub(field, 2) .. ' set for ' .. A.key}
  end
  redis.call('HDEL', K.limits, A.key .. field, unpack(A.op == 'unspend' and {A.key .. '|snext'} or {}))
  emit(K.nslog, A.op == 'unspend' and 'spend_deleted' or 'fallbacks_deleted', ev)
  return {'OK', A.op, ts}
elseif A.op == 'delete' then
  if not (c[1] or c[2] or c[3] or c[5] or c[6] or c[7] or c[8]) then return {'NOOP', 'no limit ' .. A.key} end
  redis.call('HDEL', K.limits, A.key, A.key .. '|used', A.key .. '|paused', A.key .. '|why', A.key .. '|next',
    A.key .. '|breaker', A.key .. '|bstate', A.key .. '|bwhy', A.key .. '|slots', A.key .. '|spend', A.key .. '|snext',
    A.key .. '|fallbacks', A.key .. '|weight')
  redis.call('DEL', K.log, K.window)
  emit(K.nslog, 'limit_deleted', ev)
  return {'OK', 'delete', ts}
elseif A.op == 'breaker' then
  if string.match(c[3] or '', ' (%a+)$') == 'operator' and A.source == 'app' then
    return {'NOOP', 'an operator set breaker ' .. A.key .. ': the App does not replace it'}
  end
  local value = A.breaker .. ' ' .. A.source
  if c[3] == value then return {'NOOP', 'breaker ' .. A.key .. ' is already so'} end
  redis.call('HSET', K.limits, A.key .. '|breaker', value)
  emit(K.nslog, 'breaker_set', {'breaker', A.breaker, unpack(ev)})
  return {'OK', 'breaker', ts}
elseif A.op == 'trip' then
  local untl = fmt(ts + A.for_ms)
  redis.call('HSET', K.limits, A.key .. '|bstate', 'open ' .. untl, A.key .. '|bwhy', 'opened by hand: ' .. A.reason)
  redis.call('DEL', K.window)
  emit(K.nslog, 'breaker_opened', {'until', untl, unpack(ev)})
  return {'OK', 'trip', ts + A.for_ms}
elseif A.op == 'reset' then
  if not c[4] then return {'NOOP', 'breaker ' .. A.key .. ' is closed'} end
  redis.call('HDEL', K.limits, A.key .. '|bstate', A.key .. '|bwhy')
  redis.call('DEL', K.window)
  emit(K.nslog, 'breaker_closed', ev)
  return {'OK', 'reset', ts}
elseif A.op == 'pause' then
  local untl = ts + A.for_ms
  local held = tonumber(c[2] or '')
  if held and held >= untl then return {'NOOP', 'limit ' .. A.key .. ' is paused until ' .. c[2] .. ' ms already'} end
  redis.call('HSET', K.limits, A.key .. '|paused', fmt(untl), A.key .. '|why', A.reason)
  emit(K.nslog, 'limit_paused', {'until', fmt(untl), unpack(ev)})
  return {'OK', 'pause', untl}
end
local held = tonumber(c[2] or '')
if not held or held <= ts then return {'NOOP', 'limit ' .. A.key .. ' is not paused'} end
redis.call('HDEL', K.limits, A.key .. '|paused', A.key .. '|why')
emit(K.nslog, 'limit_resumed', ev)
return {'OK', 'resume', ts}
