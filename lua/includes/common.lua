-- mc_queue: shared helpers, pasted into a script where it says "--@include common".
-- Defines no KEYS/ARGV of its own: a script names its KEYS in a table K (local K = {meta = KEYS[1],
-- ...}) and hands its ARGV to args() with the names and kinds its header declares. Every helper that writes is called only after the calling script has
-- validated everything it needs (Lua in Redis is isolated, not all-or-nothing).

local SCHEMA = '2'
local MAX_INT = 9007199254740991           -- 2^53 - 1: the largest integer a Lua number holds exactly
local MAX_N = 1000000                       -- attempt numbers
local MAX_DELAY_MS = 315360000000           -- ten years: the longest delay of a scheduled task
local MAX_RUN_AT_MS = 253402300799999       -- the last millisecond of the year 9999
local DAY_MS = 86400000
-- A packed task (pack.lua) keeps its document in hash fields of at most PACK_CHUNK bytes (Redis keeps a
-- hash whose values are all <= 64 bytes and fields <= 128 as one listpack): up to PACK_LISTPACK_CHUNKS
-- chunks, else one field. A document above PACK_MAX_BYTES is not packed (the task stays as it was).
local PACK_CHUNK = 64
local PACK_LISTPACK_CHUNKS = 100
local PACK_MAX_BYTES = 4194304
local DEFAULT_MAX_LEASE_MS = 3600000        -- a namespace's lease ceiling unless init set another

-- Redis's clock in ms, read once per script run: every time a transition records (its timestamps, its
-- events' ids, its lease expiry) is the same instant, and TIME is not called again for each event.
local NOW_MS = nil
local function now_ms()
  if not NOW_MS then
    local t = redis.call('TIME')
    NOW_MS = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return NOW_MS
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Integers up to 2^53 as decimal strings (tostring would print 1.7e+15). '%d' for a whole number: a
-- float format costs twice the instructions, and a script formats several numbers per transition.
local function fmt(n)
  if n % 1 == 0 and n <= MAX_INT and n >= -MAX_INT then return string.format('%d', n) end  -- exact there
  return string.format('%.0f', n)
end

-- ----------------------------------------------------------------------------------- argument guards
-- A script's first lines: local K = {name = KEYS[1], ...}; local A, bad = args(ARGV, {...specs...}).
-- The specs are one flat list, four entries per argument in header order: name, kind, p1, p2
-- (false when unused). Kinds:
--   int lo hi        decimal digits only (no sign, exponent, leading zero, 'inf' or 'nan'), lo <= n <= hi
--                    -> number (A.raw keeps the digits as sent)
--   int? lo hi       the same, or '' -> nil
--   dec hi           a non-negative decimal with at most 9 fraction digits, <= hi -> the string
--   text max [min]   valid UTF-8 without control characters, at most max bytes (and min) -> string
--   id max           text without spaces, at least one byte
--   json max [obj]   printable ASCII (escaped JSON) that decodes; 'obj': a JSON object -> string
--   json? max [obj]  the same, or ''
--   hex len          hex digits, exactly len characters
--   hex? len         the same, or ''
--   enum '|a|b|'     one of the values between bars ('||a|' allows '')
--   epoch            '' or '<microseconds>.<hex nonce>' (the form is checked where it differs from the current)
--   reqid            '' or 1-64 of [A-Za-z0-9_-]
--   raw max          any bytes, at most max (an index member as found, only compared and logged)
-- A bad argument gives {'E_BADARG', '<name> <why>'} before anything is read or written.

local function utf8_ok(s)
  if not string.find(s, '[\128-\255]') then return true end
  local i, n = 1, #s
  while i <= n do
    local c = string.byte(s, i)
    if c < 128 then
      i = i + 1
    elseif c >= 194 and c <= 223 then
      local c2 = string.byte(s, i + 1)
      if not c2 or c2 < 128 or c2 > 191 then return false end
      i = i + 2
    elseif c >= 224 and c <= 239 then
      local c2, c3 = string.byte(s, i + 1, i + 2)
      if not c3 or c2 < 128 or c2 > 191 or c3 < 128 or c3 > 191 then return false end
      if (c == 224 and c2 < 160) or (c == 237 and c2 > 159) then return false end  -- overlong, surrogate
      i = i + 3
    elseif c >= 240 and c <= 244 then
      local c2, c3, c4 = string.byte(s, i + 1, i + 3)
      if not c4 or c2 < 128 or c2 > 191 or c3 < 128 or c3 > 191 or c4 < 128 or c4 > 191 then return false end
      if (c == 240 and c2 < 144) or (c == 244 and c2 > 143) then return false end
      i = i + 4
    else
      return false
    end
  end
  return true
end

-- JSON as Python's json module reads it back: cjson alone also takes 0x10, +1, 01, 1., NaN, inf and
-- 1e999. Every number token outside strings must follow JSON's grammar and be finite.
local function json_numbers_ok(v)
  local i, n = 1, #v
  while i <= n do
    local q = string.find(v, '"', i, true) or (n + 1)
    for tok in string.gmatch(string.sub(v, i, q - 1), '[^%s%[%]{},:]+') do
      if tok ~= 'true' and tok ~= 'false' and tok ~= 'null' then
        local int, rest = string.match(tok, '^%-?(%d+)(.*)$')
        if not int or (#int > 1 and string.sub(int, 1, 1) == '0') then return false end
        local frac = string.match(rest, '^%.%d+(.*)$')
        if frac then rest = frac end
        if rest ~= '' and not string.match(rest, '^[eE][%+%-]?%d+$') then return false end
        local x = tonumber(tok)
        if not x or x ~= x or x == math.huge or x == -math.huge then return false end
      end
    end
    if q > n then break end
    local j = q + 1                       -- skip the string: to the next unescaped quote
    while true do
      local k = string.find(v, '[\\"]', j)
      if not k then return false end
      if string.sub(v, k, k) == '"' then i = k + 1 break end
      j = k + 2
    end
  end
  return true
end

-- Could v hold a number Python's json would refuse (hex, a sign, leading zeros, NaN, inf, a dot
-- without digits, an exponent of 3 digits or more)? When not, json_numbers_ok need not look.
-- A number stands first, or after ':', '[' or ',' (and spaces): the look is for a sign or a dot there, a leading zero
-- or 0x, a name (NaN, inf, Infinity; null too, harmlessly), a dot without digits after it, or an exponent of
-- 3 digits. Inside strings it may fire for nothing (then json_numbers_ok looks closer); it never misses.
local function json_suspect(v)
  return string.find(v, '[:,%[]%s*%-?[%+%.IiNn]') or string.find(v, '[:,%[]%s*%-?0[%dxX]')
    or string.find(v, '^%s*%-?[%+%.IiNn]') or string.find(v, '^%s*%-?0[%dxX]')  -- (a value that is a number)
    or string.find(v, '%d%.[^%d]') or string.find(v, '%d%.$') or string.find(v, '[eE][%+%-]?%d%d%d')
end

-- A task's rate limits as enqueue stores them: "<key>=<cost>[,<key>=<cost>...]" (at most MAX_LIMITS, keys
-- distinct, costs 0..999999999: 0 names a dependency only, for its circuit breaker), or ''. Returns the list
-- of {name, cost}, or nil and why.
local MAX_LIMITS = 8
local function parse_limits(v)
  local out, seen = {}, {}
  if v == '' then return out end
  for item in string.gmatch(v .. ',', '([^,]*),') do
    local name, cost = string.match(item, '^([%w][%w_%.:%-]*)=(%d+)$')
    if not name or #name > 128 or #cost > 9 or (#cost > 1 and string.sub(cost, 1, 1) == '0') then
      return nil, "must be '<key>=<cost>' items joined by ',' (keys of letters, digits, '_', '.', ':', '-', " ..
        "costs 0..999999999; 0: the task needs the key, as a circuit breaker sees it, and takes no units): got '" ..
        string.sub(item, 1, 80) .. "'"
    end
    if seen[name] then return nil, 'names ' .. name .. ' twice' end
    seen[name] = true
    out[#out + 1] = {name, tonumber(cost)}
  end
  if #out > MAX_LIMITS then return nil, 'names ' .. #out .. ' limits: at most ' .. MAX_LIMITS end
  return out
end

-- A rate limit's units in its window ending at ts: the running total ``used`` (none once its log expired)
-- less the entries that left the window; and how many entries left it. K: log.
local function window_units(K, used, win, ts)
  if redis.call('EXISTS', K.log) == 0 then return 0, 0 end
  local gone, old = 0, redis.call('ZRANGEBYSCORE', K.log, '-inf', ts - win)
  for _, m in ipairs(old) do gone = gone + (tonumber(string.match(m, ' (%d+)$')) or 0) end
  return used - gone, #old
end

-- Take ``cost`` units of rate limit ``name`` at ts (window_units said ``inwin`` in the window, ``old`` gone
-- from it): the entries that left dropped, ``member`` logged, the running total kept. K: log, limits.
local function window_take(K, name, member, cost, inwin, old, win, ts)
  if old > 0 then redis.call('ZREMRANGEBYSCORE', K.log, '-inf', ts - win) end
  redis.call('ZADD', K.log, fmt(ts), member)
  redis.call('PEXPIRE', K.log, win + 1000)  -- (idle for a window: nothing in it counts any more)
  redis.call('HSET', K.limits, name .. '|used', fmt(inwin + cost))
end

-- A circuit breaker's setting as limit_admin.lua stores it ("<failure %> <min calls> <window ms> <open ms>
-- <probes> <slow ms> <slow %> <same failure> <source>"), as numbers; nil when there is none.
local function breaker_setting(text)
  local v = {string.match(text or '', '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+)')}
  if #v < 8 then return nil end
  return {rate = tonumber(v[1]), min_calls = tonumber(v[2]), win = tonumber(v[3]), open_ms = tonumber(v[4]),
    probes = tonumber(v[5]), slow_ms = tonumber(v[6]), slow_rate = tonumber(v[7]), same = tonumber(v[8])}
end

-- Concurrency keys (bulkheads): a key's setting "<key>|slots" in the limits hash ("<slots> <on full> <source>",
-- on full: wait | reject | supersede), else its family's "<family>:*|slots" (the family: the key up to its
-- first ':', so 'repo:*' gives every 'repo:<name>' its own slots). Its holders are members of the slotheld
-- zset, its waiters of the slotwait zset, both ordered by their text (score 0): "<key>\n<15 digits>\n...",
-- the digits a holder's claim time or a waiter's place in line, so a key's are one ZRANGEBYLEX range.
local function slot_setting(text)
  local n, on_full = string.match(text or '', '^(%d+) (%a+)')
  if not n then return nil end
  return {slots = tonumber(n), on_full = on_full}
end

local function slot_family(name)
  local f = string.match(name, '^([^:]+):.')
  return f and (f .. ':*') or nil
end

-- The ZRANGEBYLEX bounds of a key's members ('\n' ends the key; '\11' is the next byte).
local function slot_range(name) return '[' .. name .. '\n', '(' .. name .. '\11' end

local function slot_pad(ms) return string.format('%015.0f', tonumber(ms) or 0) end

-- The names of a sorted set whose members are "<name>\n..." (score 0, by text: slotwait, spent), at most
-- ``limit`` of them from the one after ``after`` ('' from the first): visit(name, lo, hi) for each (lo, hi:
-- its members' ZRANGEBYLEX bounds). Returns the name to go on after, '' when every name was seen.
local function each_name(key, after, limit, visit)
  local from, seen = after == '' and '-' or '(' .. after .. '\11', 0
  while true do
    local first = redis.call('ZRANGEBYLEX', key, from, '+', 'LIMIT', 0, 1)[1]
    if not first then return '' end
    local name = string.match(first, '^([^\n]+)\n')
    local lo, hi = slot_range(name)
    visit(name, lo, hi)
    seen, from = seen + 1, hi
    if seen == limit then return name end
  end
end

-- The Attempt (n of the task at K: attempts, slotheld, slotwait, slotwake) stops running: each concurrency
-- slot it holds returns ('slots': "<key> <writer fence>,..." and 'slots_at', written by its claim), and the
-- first waiter of that key is put in the wake set (slot_wake.lua makes it due; the sweeper runs it). Safe
-- to run twice: a slot returns once (ZREM says so). Returns how many slots returned. ``held``: the Attempt's
-- 'slots' and 'slots_at' when the caller read them already (one HMGET fewer on the completion's path).
local function slots_free(K, n, aid, ts, held)
  local v = held or redis.call('HMGET', K.attempts, n .. '.slots', n .. '.slots_at')
  if not v[1] or v[1] == '' then return 0 end
  local at, freed = slot_pad(v[2]), 0
  for key in string.gmatch(v[1], '([^ ,]+) %d+') do
    if redis.call('ZREM', K.slotheld, key .. '\n' .. at .. '\n' .. aid) == 1 then
      freed = freed + 1
      local lo, hi = slot_range(key)
      local w = redis.call('ZRANGEBYLEX', K.slotwait, lo, hi, 'LIMIT', 0, 1)[1]
      if w then
        redis.call('ZREM', K.slotwait, w)
        redis.call('ZADD', K.slotwake, 'NX', fmt(ts), w)
      end
    end
  end
  return freed
end

-- Spend ceilings (denial of wallet): a key's setting "<key>|spend" in the limits hash ("<cost> <tokens>
-- <window ms> <on over> <source>", cost in thousandths, 0: that one is not capped; on over: wait | reject),
-- else its family's "<family>:*|spend" (each key of the family its own ceiling). What the key's Attempts
-- spent and may still spend is in the spent zset, by text (score 0): an Attempt claimed reserves its estimate
-- ("<key>\n~\n<attempt id>\n<cost> <tokens>"); when it stops running its reservation is replaced by what it
-- was charged, added to the bucket of the time it stopped ("<key>\n<bucket start ms, 15 digits>\n<bucket ms>\n
-- <cost> <tokens>", a window's sixtieth). A bucket counts while any of it is in the window (never less
-- than was spent: the ceiling errs toward refusing).
local SPEND_BUCKETS = 60
local function spend_setting(text)
  local c, tk, win, on_over = string.match(text or '', '^(%d+) (%d+) (%d+) (%a+)')
  if not c then return nil end
  return {cost = tonumber(c), tokens = tonumber(tk), win = tonumber(win), on_over = on_over}
end

local function spend_bucket_ms(win) return math.max(1, math.ceil(win / SPEND_BUCKETS)) end

-- The Attempt (n, attempt id aid, of the task at K: attempts, spent) stops running at ts: each reservation
-- it holds ('spend': "<key> <cost> <tokens> <bucket ms>,...", written by its claim) is replaced by what it
-- was charged (its 'cost', in thousandths, and 'tokens'), added to the key's bucket of ts. Safe to run
-- twice: a reservation is replaced once (ZREM says so). ``v``: the Attempt's 'spend', 'cost', 'tokens' when
-- the caller read them already. Returns how many reservations were replaced.
local function spend_settle(K, n, aid, ts, v)
  v = v or redis.call('HMGET', K.attempts, n .. '.spend', n .. '.cost', n .. '.tokens')
  if not v[1] or v[1] == '' then return 0 end
  local cost = math.max(0, math.floor((tonumber(v[2] or '0') or 0) * 1000 + 0.5))
  local tokens = math.max(0, tonumber(v[3] or '0') or 0)
  local settled = 0
  for key, c, tk, width in string.gmatch(v[1], '([^ ,]+) (%d+) (%d+) (%d+)') do
    if redis.call('ZREM', K.spent, key .. '\n~\n' .. aid .. '\n' .. c .. ' ' .. tk) == 1 then
      settled = settled + 1
      if cost > 0 or tokens > 0 then
        local w = tonumber(width)
        local head = key .. '\n' .. slot_pad(ts - ts % w) .. '\n'
        local b = redis.call('ZRANGEBYLEX', K.spent, '[' .. head, '(' .. head .. '\255', 'LIMIT', 0, 1)[1]
        local bw, bc, bt = string.match(b or '', '\n(%d+)\n(%d+) (%d+)$')
        if b then redis.call('ZREM', K.spent, b) end
        redis.call('ZADD', K.spent, 0, head .. (bw or width) .. '\n' .. fmt(cost + (tonumber(bc) or 0)) .. ' ' ..
          fmt(tokens + (tonumber(bt) or 0)))
      end
    end
  end
  return settled
end

-- What key ``name`` (a ceiling of window ``win``) spent in the window ending at ts, in the buckets still in it
-- (oldest first: {until when it counts, cost, tokens}), and what its running Attempts reserved; the buckets
-- out of the window ('stale', to drop). K: spent.
local function spend_used(K, name, win, ts)
  local u = {cost = 0, tokens = 0, held_cost = 0, held_tokens = 0, buckets = {}, stale = {}}
  local lo, hi = slot_range(name)
  for _, m in ipairs(redis.call('ZRANGEBYLEX', K.spent, lo, hi)) do
    local s, w, c, tk = string.match(m, '\n(%d+)\n(%d+)\n(%d+) (%d+)$')
    if s then
      local ends = tonumber(s) + tonumber(w)
      if ends <= ts - win then
        u.stale[#u.stale + 1] = m
      else
        u.cost, u.tokens = u.cost + tonumber(c), u.tokens + tonumber(tk)
        u.buckets[#u.buckets + 1] = {ends + win, tonumber(c), tonumber(tk)}
      end
    else
      c, tk = string.match(m, '\n(%d+) (%d+)$')
      u.held_cost, u.held_tokens = u.held_cost + (tonumber(c) or 0), u.held_tokens + (tonumber(tk) or 0)
    end
  end
  return u
end

local function check_arg(v, kind, p1, p2)
  if kind == 'int' or kind == 'int?' then
    if v == '' and kind == 'int?' then return nil end
    if #v > 16 or not (string.find(v, '^[1-9]%d*$') or v == '0') then
      return nil, 'must be a whole number of digits, without leading zeros'
    end
    local n = tonumber(v)
    if n < p1 or n > p2 then return nil, 'must be between ' .. fmt(p1) .. ' and ' .. fmt(p2) end
    return n
  elseif kind == 'text' or kind == 'id' then
    if #v > p1 then return nil, 'is longer than ' .. p1 .. ' bytes' end
    if kind == 'id' and (v == '' or string.find(v, ' ', 1, true)) then return nil, 'must be non-empty without spaces' end
    if p2 and #v < p2 then return nil, 'is shorter than ' .. p2 .. ' bytes' end
    if string.find(v, '[^ -~]') then  -- not plain printable ASCII: look closer
      if string.find(v, '%c') then return nil, 'must not contain control characters (newline, tab, NUL ...)' end
      if not utf8_ok(v) then return nil, 'is not valid UTF-8' end
    end
    return v
  elseif kind == 'json' or kind == 'json?' then
    if v == '' and kind == 'json?' then return v end
    if #v > p1 then return nil, 'is longer than ' .. p1 .. ' bytes' end
    if v == '' or string.find(v, '[^ -~]') then return nil, 'must be JSON in printable ASCII (escape the rest)' end
    if p2 == 'obj' and string.sub(v, 1, 1) ~= '{' then return nil, 'must be a JSON object' end
    if v == '{"$v":1}' then return v end  -- (a record at version 1's base, as most retry policies and budgets are)
    local ok, decoded = pcall(cjson.decode, v)
    if not ok or (json_suspect(v) and not json_numbers_ok(v)) then
      return nil, 'is not valid JSON (numbers finite, as JSON writes them)'
    end
    if p2 == 'obj' and type(decoded) ~= 'table' then return nil, 'must be a JSON object' end
    return v
  elseif kind == 'dec' then
    if #v > 32 or not (string.find(v, '^%d+$') or string.find(v, '^%d+%.%d%d?%d?%d?%d?%d?%d?%d?%d?$')) then
      return nil, 'must be a plain non-negative decimal (digits, optional point, at most 9 decimals)'
    end
    if tonumber(v) > p1 then return nil, 'must be at most ' .. fmt(p1) end
    return v
  elseif kind == 'hex' or kind == 'hex?' then
    if v == '' and kind == 'hex?' then return v end
    if #v ~= p1 or not string.find(v, '^%x+$') then return nil, 'must be ' .. p1 .. ' hex digits' end
    return v
  elseif kind == 'enum' then
    if not string.find(v, '|', 1, true) and string.find(p1, '|' .. v .. '|', 1, true) then return v end
    return nil, 'must be one of: ' .. string.gsub(string.sub(p1, 2, -2), '|', ', ')
  elseif kind == 'epoch' then  -- its form is checked by ns_check, only when it is not the current epoch
    if #v > 64 then return nil, "must be '' or an epoch '<time>.<nonce>'" end
    return v
  elseif kind == 'raw' then
    if #v > p1 then return nil, 'is longer than ' .. p1 .. ' bytes' end
    return v
  elseif kind == 'name' then  -- a queue's or a schedule's name
    if #v > 64 or not string.find(v, '^[%w][%w_%.%-]*$') then
      return nil, "must be 1-64 of letters, digits, '_', '.', '-', starting with a letter or digit"
    end
    return v
  elseif kind == 'limits' then
    local _, why = parse_limits(v)
    if why then return nil, why end
    return v
  elseif kind == 'lkey' or kind == 'lkey?' then  -- a rate limit's key (lkey?: or '')
    if v == '' and kind == 'lkey?' then return v end
    if #v > 128 or not string.find(v, '^[%w][%w_%.:%-]*$') then
      return nil, "must be 1-128 of letters, digits, '_', '.', ':', '-', starting with a letter or digit"
    end
    return v
  elseif kind == 'reqid' then
    if v == '' then return v end
    if #v > 64 or string.find(v, '[^%w_%-]') then return nil, 'must be 1-64 of letters, digits, _ and -' end
    return v
  end
  return nil, 'has an unknown kind ' .. tostring(kind)
end

-- The script's arguments by header name, validated; or nil and the E_BADARG reply. A.raw holds every
-- argument as the string it came as (an integer's digits, without formatting the number again). each: a
-- many-item script's arguments of each item (specs as above, the first ``skip`` of them left out), which
-- follow its own in groups, one per item: A.items is then the list of each item's, validated alike (an
-- item's raw in its .raw). none_ok: no item at all is allowed (A.items is then empty).
local function args(argv, specs, each, skip, none_ok)
  local count = #specs / 4
  local first = skip or 0
  local per = each and #each / 4 - first or 0
  local extra = #argv - count
  if (per == 0 and extra ~= 0) or (per > 0 and (extra < 0 or (extra == 0 and not none_ok) or extra % per ~= 0)) then
    return nil, {'E_BADARG', 'expected ' .. count .. ' arguments' ..
      (per > 0 and (' and ' .. per .. ' for each item') or '') .. ', got ' .. #argv}
  end
  local out, raw = {}, {}
  for i = 1, count do
    local j = 4 * i - 3
    local name, v = specs[j], argv[i]
    local value, why = check_arg(v, specs[j + 1], specs[j + 2], specs[j + 3])
    if why then return nil, {'E_BADARG', name .. ' ' .. why} end
    out[name] = value
    if value ~= v then raw[name] = v end  -- an integer (or an empty optional one): keep its digits
  end
  out.raw = raw
  if per > 0 then
    out.items = {}
    for n = 1, extra / per do
      local item, iraw = {}, {}
      for i = 1, per do
        local j = 4 * (i + first) - 3
        local name, v = each[j], argv[count + (n - 1) * per + i]
        local value, why = check_arg(v, each[j + 1], each[j + 2], each[j + 3])
        if why then return nil, {'E_BADARG', 'item ' .. n .. ': ' .. name .. ' ' .. why, n} end
        item[name] = value
        if value ~= v then iraw[name] = v end
      end
      item.raw = iraw
      out.items[n] = item
    end
  end
  return out
end

-- A many-item script's keys of each item: KEYS from ``first`` on, in groups of ``names``, one per item;
-- nil when there are not exactly that many.
local function each_keys(keys, first, names, items)
  if #keys ~= first - 1 + items * #names then return nil end
  local out = {}
  for n = 1, items do
    local t = {}
    for i, name in ipairs(names) do t[name] = keys[first - 1 + (n - 1) * #names + i] end
    out[n] = t
  end
  return out
end

local function chars(s)
  local trimmed = string.gsub(s, '^%s*(.-)%s*$', '%1')
  return select(2, string.gsub(trimmed, '[^\128-\191]', '')), trimmed
end

-- ----------------------------------------------------------------------------------- events

-- Append one event. The namespace log is a stream, capped (XADD MAXLEN ~): refusals, orphans, losses
-- and recoveries of a long-lived namespace never grow it without bound. A task's own history is a list
-- of compact entries, each the JSON array [id, 'type', typ, name, value, ...] (a stream per task would
-- preallocate ~4 KB per task): the id is '<ms>-<seq>' as XADD '*' makes it, later than the list's last
-- entry, so ids stay ordered as a stream's are. A task whose history is still a stream (written before
-- histories became lists) keeps its stream until it is packed or retired. fields: a flat list of name,
-- value; empty values are left out.
local NSLOG_MAX = 100000

local function event_id(ms, last)
  if last then
    local lms, lseq = string.match(last, '^%["(%d+)%-(%d+)"')
    lms = tonumber(lms)
    if lms and lms >= ms then return fmt(lms) .. '-' .. fmt(tonumber(lseq) + 1) end
  end
  return fmt(ms) .. '-0'
end

-- The history this call writes and its task hash, as the script declared them (history_of, right
-- after its KEYS): what emit and emit_task read of the task hash.
local HISTORY, HISTORY_TASK = nil, nil

local function history_of(k_ev, k_task)
  HISTORY, HISTORY_TASK = k_ev, k_task
end

-- What a task's first stored event comes after: enqueue stores no event of its own (task_created and
-- attempt_created, ids '<created_at>-0' and '-1', are implied by the task hash's created_at and
-- actor: mc_queue.contracts.history.whole_history), nor, while nothing else was stored before them,
-- Attempt 1's compact claim and its compact success (field 'ev' of the task hash: 'c', then 'cs'; their
-- ids follow from its '1.started_at' and '1.ended_at' as emit would have made them: see imply). False
-- for a task written before that (its list holds both) and for any other key.
local function implied_last(key)
  if key ~= HISTORY then return false end
  local t = redis.call('HMGET', HISTORY_TASK, 'created_at', 'actor', 'ev', '1.started_at', '1.ended_at')
  if not (t[1] and t[2]) then return false end
  local last = '["' .. t[1] .. '-1"'
  if t[3] == 'c' or t[3] == 'cs' then
    last = '["' .. event_id(tonumber(t[4]), last) .. '"'
    if t[3] == 'cs' then last = '["' .. event_id(tonumber(t[5]), last) .. '"' end
  end
  return last
end

-- Whether Attempt n's compact claim (have '': no event implied yet) or compact success (have 'c': its
-- claim implied) stays implied by the task hash instead of starting the task's stored history: only
-- Attempt 1 of a task that keeps its Attempts in its hash and has stored no event at all. The caller
-- then sets 'ev' (to 'c', or 'cs') where it would have emitted. On the plain path a task finishes with
-- no history key (about 350 bytes less per task), and every reader gets the same events.
local function imply(k_ev, k_task, k_att, n, have)
  if tostring(n) ~= '1' or k_att ~= k_task or k_ev ~= HISTORY or redis.call('LLEN', k_ev) > 0 then
    return false
  end
  local t = redis.call('HMGET', k_task, 'actor', 'ev', 'created_at')
  return t[1] ~= false and t[3] ~= false and (t[2] or '') == have
end

local function emit(key, typ, fields)
  local flat = {'type', typ}
  for i = 1, #fields, 2 do
    local v = fields[i + 1]
    if v ~= nil and v ~= '' and v ~= false then
      flat[#flat + 1] = fields[i]
      flat[#flat + 1] = tostring(v)
    end
  end
  local nslog = string.sub(key, -6) == ':nslog'
  local last = not nslog and redis.pcall('LINDEX', key, -1)
  if nslog or type(last) == 'table' then  -- the namespace log, or a task history kept as a stream
    if nslog then return redis.call('XADD', key, 'MAXLEN', '~', NSLOG_MAX, '*', unpack(flat)) end
    return redis.call('XADD', key, '*', unpack(flat))
  end
  local id = event_id(now_ms(), last or implied_last(key))
  table.insert(flat, 1, id)
  redis.call('RPUSH', key, cjson.encode(flat))
  return id
end

-- The id of a task's last event ('0-0' when it has none), whether its history is a list or a stream.
local function last_event_id(key)
  local last = redis.pcall('LINDEX', key, -1)
  if type(last) == 'table' then
    last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
    return last[1] and last[1][1] or '0-0'
  end
  return last and string.match(last, '^%["(%d+%-%d+)"') or '0-0'
end

-- The namespace log of this call, set by ns_check (every script that writes a task's history checks
-- the namespace first): where an event about a task whose history is packed goes.
local NSLOG = nil

-- An event about a task after its checks: into the task's history, or, when there is no such task or
-- its history has been packed (its list is gone; see pack.lua), into the namespace log with the task
-- id, so that a late write to a finished task is recorded without growing its history back. (A queued
-- task has no list either, until its first event after enqueue's: that one starts it.)
local function emit_task(k_ev, typ, fields)
  local tid = string.match(k_ev, ':t:(.+):ev$')
  if tid and NSLOG and redis.call('EXISTS', k_ev) == 0 then
    local t = k_ev == HISTORY and redis.call('HMGET', HISTORY_TASK, 'state', 'packed') or {}
    if not t[1] or t[2] then
      fields[#fields + 1] = 'task'
      fields[#fields + 1] = tid
      return emit(NSLOG, typ, fields)
    end
  end
  return emit(k_ev, typ, fields)
end

-- A refusal of a contract (not a bad argument): one audit event, one counter, the error reply.
local function refuse(k_ev, k_stats, typ, reply, fields)
  if k_stats then redis.call('HINCRBY', k_stats, typ, 1) end
  emit_task(k_ev, typ, fields)
  return reply
end

-- ----------------------------------------------------------------------------------- digests

-- SHA-256 of a short string, as lowercase hex (what mc_queue.contracts.codec.digest gives for the same
-- bytes). A short result keeps no digest of its own (complete.lua): the rare paths that must name it
-- (a replay, a conflict) compute it here. Pure Lua with the bit library: ~0.15 ms per 64-byte block on
-- these machines (100 KB took 0.23 s), so it is only used for values of at most 64 bytes (two blocks).
local function sha256_hex(msg)
  local B = bit
  if not B then  -- (a Lua without Redis's bit library, fakeredis's: the same operations on unsigned numbers, slowly)
    local W = 4294967296
    local function fold(f)  -- a bitwise operation of any number of arguments, bit by bit
      return function(a, ...)
        for _, b in ipairs({...}) do
          local x, y, r, p = a % W, b % W, 0, 1
          for _ = 1, 32 do
            local u, v = x % 2, y % 2
            if f(u, v) then r = r + p end
            x, y, p = (x - u) / 2, (y - v) / 2, p * 2
          end
          a = r
        end
        return a
      end
    end
    local function rsh(x, n) return math.floor((x % W) / 2 ^ n) end
    local function lsh(x, n) return ((x % W) * 2 ^ n) % W end
    B = {
      band = fold(function(u, v) return u == 1 and v == 1 end),
      bor = fold(function(u, v) return u == 1 or v == 1 end),
      bxor = fold(function(u, v) return u ~= v end),
      bnot = function(x) return W - 1 - x % W end,
      rshift = rsh, lshift = lsh,
      ror = function(x, n) return (rsh(x, n) + lsh(x, 32 - n)) % W end,
      tobit = function(x) return x % W end,
      tohex = function(x) return string.format('%08x', x % W) end,
    }
  end
  local band, bor, bxor, bnot, rshift, lshift, ror, tobit =
    B.band, B.bor, B.bxor, B.bnot, B.rshift, B.lshift, B.ror, B.tobit
  local k = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2}
  local h = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}
  local bits = #msg * 8
  msg = msg .. '\128' .. string.rep('\0', (55 - #msg) % 64) .. '\0\0\0' ..
    string.char(math.floor(bits / 4294967296) % 256, math.floor(bits / 16777216) % 256,
      math.floor(bits / 65536) % 256, math.floor(bits / 256) % 256, bits % 256)
  local w = {}
  for at = 1, #msg, 64 do
    for i = 1, 16 do
      local b1, b2, b3, b4 = string.byte(msg, at + (i - 1) * 4, at + (i - 1) * 4 + 3)
      w[i] = bor(lshift(b1, 24), lshift(b2, 16), lshift(b3, 8), b4)
    end
    for i = 17, 64 do
      local x, y = w[i - 15], w[i - 2]
      w[i] = tobit(w[i - 16] + bxor(ror(x, 7), ror(x, 18), rshift(x, 3)) + w[i - 7]
        + bxor(ror(y, 17), ror(y, 19), rshift(y, 10)))
    end
    local a, b, c, d, e, f, g, hh = h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8]
    for i = 1, 64 do
      local t1 = tobit(hh + bxor(ror(e, 6), ror(e, 11), ror(e, 25)) + bxor(band(e, f), band(bnot(e), g)) + k[i] + w[i])
      local t2 = tobit(bxor(ror(a, 2), ror(a, 13), ror(a, 22)) + bxor(band(a, b), band(a, c), band(b, c)))
      hh, g, f, e, d, c, b, a = g, f, e, tobit(d + t1), c, b, a, tobit(t1 + t2)
    end
    h[1], h[2], h[3], h[4] = tobit(h[1] + a), tobit(h[2] + b), tobit(h[3] + c), tobit(h[4] + d)
    h[5], h[6], h[7], h[8] = tobit(h[5] + e), tobit(h[6] + f), tobit(h[7] + g), tobit(h[8] + hh)
  end
  local out = {}
  for i = 1, 8 do out[i] = B.tohex(h[i], 8) end
  return table.concat(out)
end

-- What a producer key's entry says of its task ('<payload digest>|<handler>', as enqueue wrote it): the
-- task hash's digest, or, for a payload of at most 64 bytes that keeps none, the entry's own (written at
-- enqueue from the digest the producer sent), so that a purge leaves the entry it always left.
local function task_sig(k_idem, idem_key, task_id, digest, handler)
  if not digest then
    local owner, sent = string.match(redis.call('HGET', k_idem, idem_key) or '', '^(%S+) ([^|%s]*)|')
    digest = owner == task_id and sent or ''
  end
  return digest .. '|' .. (handler or '')
end

-- ----------------------------------------------------------------------------------- attempts

-- A hash stays one compact listpack while every value is at most 64 bytes (Redis's default
-- hash-max-listpack-value); one longer value turns the whole hash into a hash table of ~60 bytes per
-- field. The values that may be long and that no script reads back to decide anything (LONG, of the
-- task or of an Attempt) are written in chunks: the field holds LONG_MARK and the number of chunks,
-- fields '<field>#<i>' the chunks (mc_queue.contracts.packing.join_long; long_value below). A value
-- above LONG_CHUNK * LONG_MAX_CHUNKS bytes is kept whole: the hash is a hash table then, its cost
-- small beside the value's.
local LONG_CHUNK, LONG_MAX_CHUNKS, LONG_MARK = 64, 32, '\255'
local LONG = {payload = true, manifest = true, retry_policy = true, budget = true, result = true,
  failure = true, reason = true, evidence = true, hypothesis = true, tomb = true}

-- Append field name (of kind 'kind') and value v to an HSET argument list, in chunks when long.
local function put(out, name, kind, v)
  if LONG[kind] and #v > LONG_CHUNK and #v <= LONG_CHUNK * LONG_MAX_CHUNKS then
    local k = math.ceil(#v / LONG_CHUNK)
    out[#out + 1] = name
    out[#out + 1] = LONG_MARK .. k
    for i = 0, k - 1 do
      out[#out + 1] = name .. '#' .. i
      out[#out + 1] = string.sub(v, i * LONG_CHUNK + 1, (i + 1) * LONG_CHUNK)
    end
  else
    out[#out + 1] = name
    out[#out + 1] = v
  end
end

-- HSET of task fields (name, value, ...), the long ones in chunks.
local function tset(k_task, fields)
  local a = {'HSET', k_task}
  for i = 1, #fields, 2 do put(a, fields[i], fields[i], fields[i + 1]) end
  redis.call(unpack(a))
end

-- The value of field name as written, v as HGET/HMGET read it (its chunks joined when it was long).
local function long_value(key, name, v)
  if not v or string.sub(v, 1, 1) ~= LONG_MARK then return v end
  local names = {}
  for i = 0, (tonumber(string.sub(v, 2)) or 0) - 1 do names[#names + 1] = name .. '#' .. i end
  if #names == 0 then return '' end
  return table.concat(redis.call('HMGET', key, unpack(names)))
end

-- ----------------------------------------------------------------------------------- tombstones

-- A purged task's tombstone is an entry in a bucket of its queue's tombstones, not a key of its own
-- (a key each cost ~400 bytes): buckets are the task ids' ULID prefixes of 7, 8 and 9 characters
-- (mc_queue.contracts.keys.Keys.tomb_buckets, KEYS tombs0-tombs2). An entry goes to the first
-- bucket that is not full (TOMB_FULL fields, so a bucket stays a compact listpack), or to the one
-- already holding that id; a lookup (tomb_level) walks the same path and stops at the first bucket that is not
-- full. Entry: field <the ULID's last 19 characters>, "<until_ms> <attempts> <state> <fence> <ref>"; its
-- producer key in "<rest>.k", a purge's request id in "<rest>.q"; "r:<ref>" holds who and why and the
-- window, written once for all the entries of a retention pass. Each bucket on the path expires at the
-- latest end of the entries at or below it, so a lookup never loses its way to a live entry.
local TOMB_FULL = 96

local function tomb_rest(task_id) return string.sub(task_id, -19) end

-- Is rest in bucket key: (its value or nil, whether the path goes on below it). An empty bucket (the
-- common case at enqueue: no task created within those seconds was purged) costs one HLEN.
local function tomb_at(key, rest)
  local size = redis.call('HLEN', key)
  if size == 0 then return nil, false end
  return redis.call('HGET', key, rest), size >= TOMB_FULL
end

-- Where task_id's tombstone is: (level 1-3, its value), or (nil, the level a new one goes to).
local function tomb_level(k_t0, k_t1, k_t2, rest)
  local v, deeper = tomb_at(k_t0, rest)
  if v then return 1, v end
  if not deeper then return nil, 1 end
  v, deeper = tomb_at(k_t1, rest)
  if v then return 2, v end
  if not deeper then return nil, 2 end
  v = tomb_at(k_t2, rest)
  if v then return 3, v end
  return nil, 3
end

-- The entry and its fields in bucket key (tomb_put), and the bucket's expiry moved to at least gone_at.
local function tomb_write(key, rest, entry, ref, record, idem_key, request_id, gone_at)
  local out = {'HSET', key, rest, entry .. ' ' .. ref}
  if redis.call('HEXISTS', key, 'r:' .. ref) == 0 then put(out, 'r:' .. ref, 'tomb', record) end
  local old = redis.call('HGET', key, rest .. '.k')  -- an earlier tombstone of this id: its key's chunks go
  if old and string.sub(old, 1, 1) == LONG_MARK then
    for i = 0, (tonumber(string.sub(old, 2)) or 0) - 1 do redis.call('HDEL', key, rest .. '.k#' .. i) end
  end
  redis.call('HDEL', key, rest .. '.k', rest .. '.q')
  if idem_key ~= '' then put(out, rest .. '.k', 'tomb', idem_key) end
  if request_id ~= '' then put(out, rest .. '.q', 'tomb', request_id) end
  redis.call(unpack(out))
end

local function tomb_extend(key, gone_at)
  local left = redis.call('PTTL', key)
  if left < 0 or now_ms() + left < gone_at then redis.call('PEXPIREAT', key, fmt(gone_at)) end
end

-- The ref of a shared record in bucket key: a hash of its text, the next one while another text holds it.
local function tomb_ref(key, record)
  local h = #record
  for i = 1, #record do h = (h * 31 + string.byte(record, i)) % 4294967296 end
  for _ = 1, 8 do
    local ref = string.format('%08x', h)
    local have = redis.call('HGET', key, 'r:' .. ref)
    if not have or long_value(key, 'r:' .. ref, have) == record then return ref end
    h = (h + 1) % 4294967296
  end
  return string.format('%08x', h)
end

-- Write task_id's tombstone: the fields a script decides on, its producer key and request id ('' for
-- none), the shared record (JSON: kind, actor, reason, window_ms), and when the entry may go (ms).
local function tomb_put(k_t0, k_t1, k_t2, task_id, until_ms, attempts, state, fence, idem_key, request_id, record,
                        gone_at)
  local rest = tomb_rest(task_id)
  local found, d = tomb_level(k_t0, k_t1, k_t2, rest)
  d = found or d
  local entry = fmt(until_ms) .. ' ' .. fmt(attempts) .. ' ' .. state .. ' ' .. fmt(fence)
  if d == 1 then
    tomb_write(k_t0, rest, entry, tomb_ref(k_t0, record), record, idem_key, request_id, gone_at)
  elseif d == 2 then
    tomb_write(k_t1, rest, entry, tomb_ref(k_t1, record), record, idem_key, request_id, gone_at)
  else
    tomb_write(k_t2, rest, entry, tomb_ref(k_t2, record), record, idem_key, request_id, gone_at)
  end
  tomb_extend(k_t0, gone_at)
  if d >= 2 then tomb_extend(k_t1, gone_at) end
  if d == 3 then tomb_extend(k_t2, gone_at) end
end

-- The tombstone of task_id as {until_ms = n, attempts = n, request_id = s} (what a script decides on),
-- from its bucket or from a key of the old kind (k_old, JSON); nil when there is none.
local function tomb_get(k_t0, k_t1, k_t2, k_old, task_id)
  local rest = tomb_rest(task_id)
  local found, v = tomb_level(k_t0, k_t1, k_t2, rest)
  if found then
    local until_ms, attempts = string.match(v, '^(%d+) (%d+) ')
    local q
    if found == 1 then q = long_value(k_t0, rest .. '.q', redis.call('HGET', k_t0, rest .. '.q'))
    elseif found == 2 then q = long_value(k_t1, rest .. '.q', redis.call('HGET', k_t1, rest .. '.q'))
    else q = long_value(k_t2, rest .. '.q', redis.call('HGET', k_t2, rest .. '.q')) end
    return {until_ms = tonumber(until_ms) or 0, attempts = tonumber(attempts) or 0, request_id = q or ''}
  end
  local raw = redis.call('GET', k_old)
  if not raw then return nil end
  local ok, rec = pcall(cjson.decode, raw)
  if not ok or type(rec) ~= 'table' then return {until_ms = 0, attempts = 0, request_id = ''} end
  return {until_ms = tonumber(rec.until_ms) or 0, attempts = tonumber(rec.attempts) or 0,
    request_id = type(rec.request_id) == 'string' and rec.request_id or ''}
end

-- Attempt fields live in the task hash as "<n>.<field>" (a task field's name never starts with a
-- digit); enqueue writes Attempt 1's state there. A task written before 2026-12 keeps them in a hash of
-- its own, the 'attempts' key a script is given, and its task hash has no '1.state'. Every script
-- given both calls this right after its KEYS (K.attempts = attempts_of(K.task, K.attempts)): from
-- then on K.attempts is where they are (for a task that does not exist, or is packed, the key given,
-- which holds nothing either). enqueue, which creates the task, uses the task hash.
local function attempts_of(k_task, k_att)
  if redis.call('HEXISTS', k_task, '1.state') == 1 then return k_task end
  return k_att
end

-- What every script given a task's history and Attempts hash calls right after its KEYS.
local function bind_task(K)
  history_of(K.events, K.task)
  K.attempts = attempts_of(K.task, K.attempts)
end

-- Attempt fields as "<n>.<field>".
local function aget(k_att, n, field)
  return redis.call('HGET', k_att, n .. '.' .. field)
end

local function aset(k_att, n, fields)
  local a = {'HSET', k_att}
  for i = 1, #fields, 2 do put(a, n .. '.' .. fields[i], fields[i], tostring(fields[i + 1])) end
  redis.call(unpack(a))
end

-- The fields of Attempt n (or, in a hash of their own, of every Attempt) as a flat list
-- ("<n>.<field>", value, ...), and the task's manifest as one more pair ('manifest', json) with the
-- task fields a compact manifest leaves out ('handler', 'payload_digest'): an Attempt's frozen
-- manifest is the task's, kept once. The client keeps the fields of Attempt n. In the task hash
-- of a task with a short payload the whole hash is returned (HGETALL costs Redis ~35k instructions
-- less than a scan); with a long one they are found by HSCAN MATCH, and the payload stays in Redis.
local function attempt_snapshot(k_att, k_task, n)
  local flat
  local payload = k_att == k_task and redis.call('HGET', k_task, 'payload')
  if not payload or (#payload <= LONG_CHUNK and string.sub(payload, 1, 1) ~= LONG_MARK) then
    flat = redis.call('HGETALL', k_att)
  else
    flat = {}
    local cursor = '0'
    repeat
      local page = redis.call('HSCAN', k_task, cursor, 'MATCH', n .. '.*', 'COUNT', 1000)
      cursor = page[1]
      for _, v in ipairs(page[2]) do flat[#flat + 1] = v end
    until cursor == '0'
  end
  local t = redis.call('HMGET', k_task, 'manifest', 'handler', 'payload_digest', 'created_at')
  if t[1] then
    flat[#flat + 1] = 'manifest'
    flat[#flat + 1] = long_value(k_task, 'manifest', t[1])
    flat[#flat + 1] = 'handler'
    flat[#flat + 1] = t[2] or ''
    flat[#flat + 1] = 'payload_digest'
    flat[#flat + 1] = t[3] or ''
    if not t[3] and k_att ~= k_task then  -- a short payload keeps no digest: the client computes it from
      flat[#flat + 1] = 'payload'          -- the payload (in the whole task hash above, when it holds them)
      flat[#flat + 1] = redis.call('HGET', k_task, 'payload') or ''
    end
  end
  if t[4] then  -- Attempt 1's created_at and due_at, when it keeps none of its own (enqueue.lua)
    flat[#flat + 1] = 'created_at'
    flat[#flat + 1] = t[4]
  end
  return flat
end

-- ----------------------------------------------------------------------------------- finished tasks

-- The states a task waits in for a person (retention keeps them longer) and the ones it ends in.
local TASK_STATES = {'scheduled', 'waiting', 'pending', 'running', 'backoff', 'succeeded', 'failed', 'blocked', 'quarantined', 'canceled'}
local HELD = {failed = true, blocked = true, quarantined = true}
local DONE = {succeeded = true, canceled = true}

-- Keep the queue's finished and held indexes in step with a task's move (K.done, K.held): a task
-- that finished enters done (retention; the sweeper walks it to pack the task's history a minute
-- later: Maintenance.pack_due); one that waits for a person enters held, and leaves it when a retry,
-- a replay or a cancel takes it out. A task that ends (done or held) with dependents waiting on it
-- (its 'dependents' field, enqueue_after.lua) enters the namespace's released index (K.released), in
-- the same step: the obligation to release or cancel them is recorded with the end itself, and the
-- sweeper carries it out (release.lua) within its next look (~50 ms). One HEXISTS per end.
local function index_end(K, task_id, from, to, ts)
  if from == to then return end
  if HELD[from] and not HELD[to] then redis.call('ZREM', K.held, task_id) end
  if HELD[to] then
    redis.call('ZADD', K.held, fmt(ts), task_id)
  elseif DONE[to] then
    redis.call('ZADD', K.done, fmt(ts), task_id)
  end
  if K.released and (HELD[to] or DONE[to]) and redis.call('HEXISTS', K.task, 'dependents') == 1 then
    redis.call('ZADD', K.released, fmt(ts), task_id)
  end
end

-- The fields of an effect record that effect_begin and effect_done write (a caller's record may not).
local EFFECT_OWN_FIELDS = {'state', 'attempt', 'fence', 'worker', 'intent_at', 'key', 'record_json', 'receipt_json',
  'receipt', 'receipt_at', 'receipt_attempt', 'settled_by', 'source', 'note'}

-- A task's states that have not ended: its queue's depth (queue caps) and its fairness key's open tasks (key caps).
local OPEN = {scheduled = true, waiting = true, pending = true, running = true, backoff = true}

-- Add n to a counter, which is dropped when it reaches 0 (or less: a counter older than what it counts).
local function count_add(k_counts, field, n)
  if redis.call('HINCRBY', k_counts, field, n) <= 0 then redis.call('HDEL', k_counts, field) end
end

-- Move a task between states in its queue's counters ("<queue>|<state>"). A task that starts or stops being open
-- (OPEN) moves its payload's bytes in its queue's "<queue>|bytes" too, and, with a fairness key, its key's
-- "@<key>|open" and "@<key>|bytes" (admit.lua caps by count and by bytes). k_task: the task hash, whose payload
-- length and fair_key are read only when the move crosses that line; fair_key and nbytes: what an enqueue knows
-- (fair_key '' for none), or a caller that read the key already (nbytes nil: read).
local function move_count(k_counts, queue, from, to, k_task, fair_key, nbytes)
  if from == to then return end
  if from and from ~= '' then redis.call('HINCRBY', k_counts, queue .. '|' .. from, '-1') end
  if to and to ~= '' then redis.call('HINCRBY', k_counts, queue .. '|' .. to, '1') end
  if (OPEN[from] or false) == (OPEN[to] or false) or not (k_task or nbytes) then return end
  local sign = OPEN[to] and 1 or -1
  local key = fair_key or redis.call('HGET', k_task, 'fair_key')
  local size = (nbytes or redis.call('HSTRLEN', k_task, 'payload')) * sign
  count_add(k_counts, queue .. '|bytes', size)
  if key and key ~= '' then
    count_add(k_counts, '@' .. key .. '|open', sign)
    count_add(k_counts, '@' .. key .. '|bytes', size)
  end
end

-- Histogram buckets of the Attempt metrics in ms (mc_queue.ops.metrics.BUCKETS_S reads them back): bucket i
-- counts values <= bound i, bucket #bounds + 1 the values above every bound.
local METRIC_BUCKETS_MS = {100, 500, 1000, 5000, 15000, 30000, 60000, 120000, 300000, 600000, 1800000,
  3600000, 7200000, 14400000}

-- Count one Attempt observation in the stats hash, called by the script that makes the move after all
-- its checks: kind 'wait' (claim: due time to claim) or 'fin' (claim to end, by outcome). The handler
-- is the task's, read by the caller with the task's other fields. Two HINCRBYs:
-- '<kind>|<queue>|<handler>[|<outcome>]|<bucket>' += 1, '<kind>_ms|<queue>|<handler>' += ms.
local function observe(k_stats, handler, kind, queue, outcome, ms)
  if ms < 0 then ms = 0 end  -- Redis's clock went back
  local i = 1
  while METRIC_BUCKETS_MS[i] and ms > METRIC_BUCKETS_MS[i] do i = i + 1 end
  local qh = (queue or '') .. '|' .. (handler or '')
  redis.call('HINCRBY', k_stats, kind .. '|' .. qh .. (outcome and ('|' .. outcome) or '') .. '|' .. i, '1')
  redis.call('HINCRBY', k_stats, kind .. '_ms|' .. qh, fmt(ms))
end

-- ----------------------------------------------------------------------------------- memory

-- Past this share of `maxmemory`, new work is refused (enqueue answers E_OVERLOADED): the rest is
-- headroom for the claims, completions and reconciliations of work already admitted. Redis itself
-- refuses every write script at 100% (noeviction).
local ENQUEUE_MEMORY_SHARE = 0.9  -- mc_queue.client.reads.ENQUEUE_MEMORY_SHARE reports the headroom to it

-- INFO memory costs an enqueue more than all its writes (Redis builds the whole section as text). So a
-- reading is kept in the namespace meta and reused for at most MEM_READING_MS: 'mem_at' (when, Redis's
-- clock, ms) and 'mem_room' (the bytes then left below the share, less the estimated cost of each
-- enqueue admitted on that reading since). A reading is taken again when it is older, or when the room
-- it left is smaller than this enqueue's cost: near the mark every enqueue reads INFO, as before. A new
-- maxmemory (CONFIG SET) is seen within MEM_READING_MS. A refusal writes nothing.
local MEM_READING_MS = 1000

-- The bytes an enqueue of these argument sizes may add, over-estimated: a queued task's records take
-- about 1.7 KB besides its payload and manifests, which a hash of long values may hold twice.
local function enqueue_cost(bytes)
  return 4096 + 2 * bytes
end

-- nil when Redis has no maxmemory or is below the share, else why new work is refused. m: meta_read's
-- table (its mem_at and mem_room); an admission records its cost on the reading, or a new reading.
local function memory_pressure(share, m, k_meta, cost)
  local ts = now_ms()
  local at, room = tonumber(m.mem_at or ''), tonumber(m.mem_room or '')
  if at and room and ts >= at and ts - at < MEM_READING_MS and room >= cost then
    redis.call('HSET', k_meta, 'mem_room', fmt(room - cost))
    return nil
  end
  local info = redis.pcall('INFO', 'memory')
  if type(info) ~= 'string' then return nil end  -- INFO not allowed (an ACL): no shedding, as Redis has none
  local maxm = tonumber(string.match(info, '\nmaxmemory:(%d+)'))
  local used = tonumber(string.match(info, 'used_memory:(%d+)'))
  if not maxm or maxm == 0 or not used then
    room = MAX_INT
  elseif used <= maxm * share then
    room = math.floor(maxm * share) - used
  else
    return 'Redis uses ' .. fmt(used) .. ' of its maxmemory of ' .. fmt(maxm) .. ' bytes (above ' ..
    fmt(share * 100) .. '%): new work is refused until memory is freed (finished tasks purged, maxmemory ' ..
    'raised); work already admitted goes on'
  end
  redis.call('HSET', k_meta, 'mem_at', fmt(ts), 'mem_room', fmt(room - cost))
  return nil
end

-- ----------------------------------------------------------------------------------- namespace

-- The run id of this redis-server process (a new one at every start), or nil if INFO is not allowed.
local function run_id()
  local info = redis.pcall('INFO', 'server')
  if type(info) ~= 'string' then return nil end
  local i = string.find(info, 'run_id:', 1, true)
  return i and string.sub(info, i + 7, i + 46) or nil
end

-- The task's current fence as stored ('0' before its first), wherever it is kept.
local function fence_of(k_task, k_fence)
  return redis.call('HGET', k_task, 'fence') or redis.call('GET', k_fence) or '0'
end

-- The next fence for a task: HINCRBY of the task's fence counter (field 'fence' of the task hash,
-- absent until the first fence; a task written before the counter moved there keeps a key of its own, moved
-- into the hash here, at its next fence), raised above the namespace floor. The floor is raised to
-- Redis TIME in microseconds by `mcq recover`, and also by the first
-- fence issued by a redis-server process that did not issue the previous one (a restart, a
-- failover): its data may be an older copy whose counters are behind, but the clock is not, so no
-- fence handed out before the restart can come again, even if nobody noticed a loss yet.
-- held: the task hash's 'fence' field as the caller read it (nil when it has none: only then can a
-- key of the old kind exist, and it is looked for).
local function next_fence(k_meta, k_fence, k_task, held)
  local m = redis.call('HMGET', k_meta, 'floor', 'run_id')
  local floor = tonumber(m[1] or '0') or 0
  local rid = run_id()
  if rid == nil or rid ~= m[2] then
    local t = now_us()
    if t > floor then floor = t end
    redis.call('HSET', k_meta, 'floor', fmt(floor), 'run_id', rid or '', 'restart_seen_at', now_ms())
  end
  local old = not held and redis.call('GET', k_fence)
  if old then
    redis.call('DEL', k_fence)
    redis.call('HSET', k_task, 'fence', old)
  end
  local f = redis.call('HINCRBY', k_task, 'fence', '1')
  if f <= floor then f = redis.call('HINCRBY', k_task, 'fence', fmt(floor + 1 - f)) end
  return f
end

local function mark_lost(k_meta, k_nslog, why, who)
  local ts = now_ms()
  redis.call('HSET', k_meta, 'state', 'lost', 'lost_at', ts, 'lost_reason', why)
  if redis.call('HEXISTS', k_meta, 'floor') == 0 then redis.call('HSET', k_meta, 'floor', 0, 'seq', 0) end
  redis.call('HSETNX', k_meta, 'schema', SCHEMA)
  emit(k_nslog, 'state_loss_detected', {'reason', why, 'actor', who})
  return {'E_NSLOST', why}
end

-- An epoch is "<Redis TIME in microseconds>.<nonce>": epochs are ordered by when they were made.
local function new_epoch(nonce)
  return fmt(now_us()) .. '.' .. nonce
end

local function epoch_time(e)
  return tonumber(string.match(e or '', '^(%d+)%.') or '')
end

-- The namespace meta the checks below need (one read).
local function meta_read(k_meta, more)
  -- (each field read costs a script ~2.7k instructions: the lease ceiling and the memory reading only
  -- for the scripts that use them, more = true; max_lease is nil otherwise)
  if not more then
    local m = redis.call('HMGET', k_meta, 'state', 'epoch', 'seq', 'recovered_at')
    return {state = m[1], epoch = m[2], seq = tonumber(m[3] or '0') or 0, recovered_at = m[4]}
  end
  local m = redis.call('HMGET', k_meta, 'state', 'epoch', 'seq', 'recovered_at', 'max_lease_ms', 'mem_at', 'mem_room')
  return {state = m[1], epoch = m[2], seq = tonumber(m[3] or '0') or 0, recovered_at = m[4],
          max_lease = tonumber(m[5] or '') or DEFAULT_MAX_LEASE_MS, mem_at = m[6], mem_room = m[7]}
end

-- Is the namespace usable? nil when yes, else an error reply. A missing meta, an unknown epoch or
-- a claim sequence lower than one a client has already seen means Redis lost acknowledged state:
-- the namespace is marked lost and refuses transitions until `mcq recover` has run.
-- An epoch older than the current one is retired (not lost) only once a recovery has run: then the
-- fence floor already lies above every fence issued under it. Without a recovery, an epoch this
-- Redis does not hold means it lost the namespace and someone re-created it.
--   allow_retired: a fenced write from before a recovery goes on to the fence check (which refuses it).
--   recovering_epoch: the one caller allowed while the namespace is recovering (recover's own steps).
local function ns_check(m, k_meta, k_epochs, k_nslog, epoch, min_seq, who, allow_retired, recovering_epoch)
  NSLOG = k_nslog
  if not m.state then
    -- A caller that never loaded the namespace (no epoch) and finds no meta has no evidence of a loss:
    -- the namespace was never created (a sweeper or a read that started before any writer). Nothing is
    -- written; the first writer's init creates it (or finds the traces of a real loss).
    if epoch == '' then return {'E_NONS', 'namespace does not exist yet: nothing to do until a writer creates it'} end
    return mark_lost(k_meta, k_nslog,
      'namespace meta is missing: Redis lost its data (restart without persistence, flush, or an older snapshot)', who)
  end
  if m.state == 'recovering' and recovering_epoch and recovering_epoch ~= '' and recovering_epoch == m.epoch then
    return nil
  end
  if m.state ~= 'ok' then
    return {'E_NSLOST', 'namespace state is ' .. m.state .. ' (' .. (redis.call('HGET', k_meta, 'lost_reason') or
      'a recovery is running') .. '): run `mcq recover`'}
  end
  if epoch ~= '' and epoch ~= m.epoch then
    if not string.find(epoch, '^%d+%.%x+$') then return {'E_BADARG', "epoch must be '' or '<time>.<nonce>'"} end
    local pt, ct = epoch_time(epoch), epoch_time(m.epoch)
    if redis.call('SISMEMBER', k_epochs, epoch) == 1 or (m.recovered_at and pt and ct and pt < ct) then
      if allow_retired then return nil end
      return {'E_EPOCH', m.epoch}
    end
    if pt and pt > now_us() then return {'E_BADARG', 'epoch ' .. epoch .. ' lies in the future: not one Redis issued'} end
    return mark_lost(k_meta, k_nslog, 'a client presented epoch ' .. epoch .. ' which this Redis never issued (current ' .. m.epoch .. ')', who)
  end
  if (min_seq or 0) > m.seq then
    return mark_lost(k_meta, k_nslog, 'claim sequence went backwards: a client saw ' .. fmt(min_seq) .. ', Redis has ' .. fmt(m.seq), who)
  end
  return nil
end

-- ----------------------------------------------------------------------------------- fenced writes

-- The lease is a key of its own: it exists while the lease is live (PXAT at claim, PEXPIREAT at
-- renew: the key dies at exactly the expiry the lease index holds, never a millisecond later) and holds "<attempt>:<fence>", so a lease of another Attempt or fence is not this one.
local function lease_value(n, fence)
  return n .. ':' .. (type(fence) == 'string' and fence or fmt(fence))
end

-- A script's own argument specs followed by shared lists (fenced_args(), decision_args()): one list.
local function with(specs, ...)
  for _, extra in ipairs({...}) do
    for _, s in ipairs(extra) do specs[#specs + 1] = s end
  end
  return specs
end

-- An index entry whose task (or attempt) is gone: drop it and say so in the namespace log, so that
-- no sweep and no recovery ever stops on it.
local function drop_orphan(k_index, k_nslog, member, why, who)
  if redis.call('ZREM', k_index, member) == 1 then
    local shown = string.gsub(string.sub(member, 1, 300), '[%c\128-\255]', '?')
    emit(k_nslog, 'orphan_index_entry', {'index', k_index, 'member', shown, 'reason', why, 'actor', who})
    return true
  end
  return false
end
