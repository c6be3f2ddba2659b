-- mc_queue: shared helpers, pasted into a script where it says "--@include common".
-- Defines no KEYS/ARGV of its own: a script hands its KEYS and ARGV to keys() and args() with the
-- names its header declares. Every helper that writes is called only after the calling script has
-- validated everything it needs (Lua in Redis is isolated, not all-or-nothing).

local SCHEMA = '2'
local MAX_INT = 9007199254740991           -- 2^53 - 1: the largest integer a Lua number holds exactly
local MAX_N = 1000000                       -- attempt numbers
local DAY_MS = 86400000
local DEFAULT_MAX_LEASE_MS = 3600000        -- a namespace's lease ceiling unless init set another

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Integers up to 2^53 as decimal strings (tostring would print 1.7e+15).
local function fmt(n)
  return string.format('%.0f', n)
end

-- ----------------------------------------------------------------------------------- argument guards
-- A script's first lines: local K = keys(KEYS, {...names...}); local A, bad = args(ARGV, {...specs...}).
-- Each spec is {name, kind, ...}; kinds:
--   int lo hi        decimal digits only (no sign, exponent, 'inf' or 'nan'), lo <= n <= hi -> number
--   int? lo hi       the same, or '' -> nil
--   dec hi           a non-negative decimal with at most 9 fraction digits, <= hi -> the string
--   text max [min]   valid UTF-8 without control characters, at most max bytes (and min) -> string
--   id max           text without spaces, at least one byte
--   json max [obj]   printable ASCII (escaped JSON) that decodes; 'obj': a JSON object -> string
--   json? max [obj]  the same, or ''
--   hex len          lowercase hex digits of exactly len characters
--   hex? len         the same, or ''
--   enum a|b|c       one of the listed values ('' only when listed as the first, empty, value)
--   epoch            '' or '<microseconds>.<hex nonce>'
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

local function check_arg(v, spec)
  local kind = spec[2]
  if type(v) ~= 'string' then return nil, 'is missing' end
  if kind == 'int' or kind == 'int?' then
    if v == '' and kind == 'int?' then return nil end
    if #v > 16 or not string.match(v, '^%d+$') then return nil, 'must be a whole number of digits' end
    local n = tonumber(v)
    if n < spec[3] or n > spec[4] then return nil, 'must be between ' .. fmt(spec[3]) .. ' and ' .. fmt(spec[4]) end
    return n
  elseif kind == 'dec' then
    if #v > 32 or not (string.match(v, '^%d+$') or string.match(v, '^%d+%.%d%d?%d?%d?%d?%d?%d?%d?%d?$')) then
      return nil, 'must be a plain non-negative decimal (digits, optional point, at most 9 decimals)'
    end
    if tonumber(v) > spec[3] then return nil, 'must be at most ' .. fmt(spec[3]) end
    return v
  elseif kind == 'text' or kind == 'id' then
    if #v > spec[3] then return nil, 'is longer than ' .. spec[3] .. ' bytes' end
    if kind == 'id' and (v == '' or string.find(v, ' ', 1, true)) then return nil, 'must be non-empty without spaces' end
    if spec[4] and #v < spec[4] then return nil, 'is shorter than ' .. spec[4] .. ' bytes' end
    if string.find(v, '%c') then return nil, 'must not contain control characters (newline, tab, NUL ...)' end
    if not utf8_ok(v) then return nil, 'is not valid UTF-8' end
    return v
  elseif kind == 'json' or kind == 'json?' then
    if v == '' and kind == 'json?' then return v end
    if #v > spec[3] then return nil, 'is longer than ' .. spec[3] .. ' bytes' end
    if v == '' or string.find(v, '[^\32-\126]') then return nil, 'must be JSON in printable ASCII (escape the rest)' end
    if spec[4] == 'obj' and string.sub(v, 1, 1) ~= '{' then return nil, 'must be a JSON object' end
    local ok, decoded = pcall(cjson.decode, v)
    if not ok or not json_numbers_ok(v) then return nil, 'is not valid JSON (numbers finite, as JSON writes them)' end
    if spec[4] == 'obj' and type(decoded) ~= 'table' then return nil, 'must be a JSON object' end
    return v
  elseif kind == 'hex' or kind == 'hex?' then
    if v == '' and kind == 'hex?' then return v end
    if #v ~= spec[3] or string.find(v, '[^0-9a-f]') then return nil, 'must be ' .. spec[3] .. ' lowercase hex digits' end
    return v
  elseif kind == 'enum' then
    for i = 3, #spec do if v == spec[i] then return v end end
    return nil, 'must be one of: ' .. table.concat(spec, ', ', 3)
  elseif kind == 'epoch' then
    if v == '' then return v end
    if #v > 64 or not string.match(v, '^%d+%.%x+$') then return nil, "must be '' or an epoch '<time>.<nonce>'" end
    return v
  elseif kind == 'raw' then
    if #v > spec[3] then return nil, 'is longer than ' .. spec[3] .. ' bytes' end
    return v
  elseif kind == 'reqid' then
    if v == '' then return v end
    if #v > 64 or string.find(v, '[^%w_%-]') then return nil, 'must be 1-64 of letters, digits, _ and -' end
    return v
  end
  return nil, 'has an unknown kind ' .. tostring(kind)
end

-- The script's arguments by header name, validated; or nil and the E_BADARG reply.
local function args(argv, specs)
  if #argv ~= #specs then
    return nil, {'E_BADARG', 'expected ' .. #specs .. ' arguments, got ' .. #argv}
  end
  local out = {}
  for i, spec in ipairs(specs) do
    local value, why = check_arg(argv[i], spec)
    if why then return nil, {'E_BADARG', spec[1] .. ' ' .. why} end
    out[spec[1]] = value
  end
  return out
end

-- The script's keys by header name.
local function keys(list, names)
  local out = {}
  for i, name in ipairs(names) do out[name] = list[i] end
  return out
end

-- Characters (not bytes) of a string after trimming spaces.
local function chars(s)
  local trimmed = string.gsub(s, '^%s*(.-)%s*$', '%1')
  return select(2, string.gsub(trimmed, '[^\128-\191]', '')), trimmed
end

-- ----------------------------------------------------------------------------------- events

-- Append one event to a stream. fields: flat list of name, value; empty values are left out.
local function emit(key, typ, fields)
  local a = {'XADD', key, '*', 'type', typ}
  for i = 1, #fields, 2 do
    local v = fields[i + 1]
    if v ~= nil and v ~= '' and v ~= false then
      a[#a + 1] = fields[i]
      a[#a + 1] = tostring(v)
    end
  end
  return redis.call(unpack(a))
end

-- A refusal of a contract (not a bad argument): one audit event, one counter, the error reply.
local function refuse(k_ev, k_stats, typ, reply, fields)
  if k_stats then redis.call('HINCRBY', k_stats, typ, 1) end
  emit(k_ev, typ, fields)
  return reply
end

-- ----------------------------------------------------------------------------------- attempts

-- Attempt fields live in one hash per task as "<n>.<field>".
local function aget(k_att, n, field)
  return redis.call('HGET', k_att, n .. '.' .. field)
end

local function aset(k_att, n, fields)
  local a = {'HSET', k_att}
  for i = 1, #fields, 2 do
    a[#a + 1] = n .. '.' .. fields[i]
    a[#a + 1] = tostring(fields[i + 1])
  end
  redis.call(unpack(a))
end

-- All fields of Attempt n as a flat list (name, value, ...), without the "<n>." prefix.
local function attempt_snapshot(k_att, n)
  local prefix = n .. '.'
  local out = {}
  local all = redis.call('HGETALL', k_att)
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, #prefix) == prefix then
      out[#out + 1] = string.sub(all[i], #prefix + 1)
      out[#out + 1] = all[i + 1]
    end
  end
  return out
end

local function move_count(k_counts, queue, from, to)
  if from == to then return end
  if from and from ~= '' then redis.call('HINCRBY', k_counts, queue .. '|' .. from, -1) end
  if to and to ~= '' then redis.call('HINCRBY', k_counts, queue .. '|' .. to, 1) end
end

-- ----------------------------------------------------------------------------------- namespace

-- The run id of this redis-server process (a new one at every start), or nil if INFO is not allowed.
local function run_id()
  local info = redis.pcall('INFO', 'server')
  if type(info) ~= 'string' then return nil end
  return string.match(info, 'run_id:(%x+)')
end

-- The next fence for a task: INCR of the task's fence counter, raised (INCRBY) above the namespace
-- floor. The floor is raised to Redis TIME in microseconds by `mcq recover`, and also by the first
-- fence issued by a redis-server process that did not issue the previous one (a restart, a
-- failover): its data may be an older copy whose counters are behind, but the clock is not, so no
-- fence handed out before the restart can come again, even if nobody noticed a loss yet.
local function next_fence(k_meta, k_fence)
  local m = redis.call('HMGET', k_meta, 'floor', 'run_id')
  local floor = tonumber(m[1] or '0') or 0
  local rid = run_id()
  if rid == nil or rid ~= m[2] then
    local t = now_us()
    if t > floor then floor = t end
    redis.call('HSET', k_meta, 'floor', fmt(floor), 'run_id', rid or '', 'restart_seen_at', now_ms())
  end
  local f = redis.call('INCR', k_fence)
  if f <= floor then f = redis.call('INCRBY', k_fence, floor + 1 - f) end
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
local function meta_read(k_meta)
  local m = redis.call('HMGET', k_meta, 'state', 'epoch', 'seq', 'recovered_at', 'max_lease_ms')
  return {state = m[1], epoch = m[2], seq = tonumber(m[3] or '0') or 0, recovered_at = m[4],
          max_lease = tonumber(m[5] or '') or DEFAULT_MAX_LEASE_MS}
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
  if not m.state then
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

-- The lease is a key of its own: it exists while the lease is live (PX at claim, PEXPIRE at renew)
-- and holds "<attempt>:<fence>", so a lease of another Attempt or fence is not this one.
local function lease_value(n, fence)
  return tostring(n) .. ':' .. fmt(fence)
end

-- The check every fenced write (renew, complete, fail, checkpoint, effects, cancel_ack) makes before
-- writing, after the namespace check: the fence, then the Attempt's state, then the lease; a cancel
-- request too when check_cancel. Returns nil and Redis's time when the write may go on; otherwise it
-- records the refusal (a stale_write_refused event) and returns the error reply.
-- A presented fence above the current one is evidence that Redis went back in time only when the
-- caller holds the claim record of that fence (proof: the claim sequence it was issued at); without
-- it the write is refused as stale ('fence_ahead') and the namespace stays ok.
-- K: meta, nslog, stats, task, attempts, events, fence, lease.
-- A: n, fence, epoch, min_seq, proof (nil when the caller has no claim record).
local function fence_check(K, A, who, digest, op, check_cancel)
  local ts = now_ms()
  local latest = redis.call('HGET', K.task, 'attempts')
  if not latest then return {'E_NOTASK', 'no such task'} end
  local cur = tonumber(redis.call('GET', K.fence) or '0')
  local n, presented = fmt(A.n), A.fence
  local state = aget(K.attempts, n, 'state')
  local refusal, code = nil, nil
  if presented > cur then
    if A.proof then
      emit(K.events, 'state_loss_detected', {'attempt', n, 'op', op, 'presented_fence', fmt(presented),
        'current_fence', fmt(cur), 'worker', who, 'claim_seq', fmt(A.proof)})
      return mark_lost(K.meta, K.nslog, 'a worker presented fence ' .. fmt(presented) .. ' (claimed at sequence ' ..
        fmt(A.proof) .. ') but Redis holds ' .. fmt(cur) .. ' for ' .. K.task, who)
    end
    refusal, code = 'fence_ahead', 'E_STALE'
  elseif presented ~= cur or n ~= latest then
    refusal, code = 'stale_fence', 'E_STALE'
  elseif state ~= 'running' then
    refusal, code = 'attempt_' .. tostring(state), 'E_STATE'
  elseif redis.call('GET', K.lease) ~= lease_value(n, presented) then
    refusal, code = 'lease_expired', 'E_EXPIRED'
  end
  if refusal then
    return refuse(K.events, K.stats, 'stale_write_refused',
      {code, fmt(cur), tostring(state), aget(K.attempts, n, 'lease_exp') or ''},
      {'attempt', n, 'op', op, 'refusal', refusal, 'presented_fence', fmt(presented), 'current_fence', fmt(cur),
       'worker', who, 'payload_digest', digest, 'attempt_state', state or 'missing'})
  end
  if check_cancel then
    -- After a cancel request the executor may renew (to hear the signal) and record receipts of effects
    -- already made, but it may not start an effect, checkpoint, complete or fail: it acknowledges.
    local reason = redis.call('HGET', K.task, 'cancel_requested')
    if reason then
      return refuse(K.events, K.stats, 'stale_write_refused', {'E_CANCELED', reason},
        {'attempt', n, 'op', op, 'refusal', 'cancel_requested', 'worker', who, 'payload_digest', digest,
         'reason', reason})
    end
  end
  return nil, ts
end

-- The whole preamble of a fenced write: the namespace (a write from before a recovery goes on to the
-- fence check, which refuses it), then fence_check. K also needs epochs.
local function fenced(K, A, who, digest, op, check_cancel)
  local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, A.min_seq, who, true)
  if err then return err end
  return fence_check(K, A, who, digest, op, check_cancel)
end

-- The arguments every fenced write ends with, after its own (built only by the scripts that use them).
local function fenced_args()
  return {
    {'epoch', 'epoch'},
    {'min_seq', 'int', 0, MAX_INT},
    {'proof', 'int?', 1, MAX_INT},
  }
end

-- A script's own argument specs followed by shared lists (fenced_args(), decision_args()): one list.
local function with(specs, ...)
  for _, extra in ipairs({...}) do
    for _, s in ipairs(extra) do specs[#specs + 1] = s end
  end
  return specs
end

-- ----------------------------------------------------------------------------------- decisions

-- Apply the decision that follows a failed Attempt n, in the same script as the failure:
--   ''/'wait'  the task waits in failed for a person (retry_task);
--   'retry'    Attempt n+1 pending, due after delay_ms (task backoff, or pending when 0);
--   'stop'     the task is blocked and an attention item is recorded;
--   'quarantine' the task is dead-lettered with its history (and an attention item).
-- Returns the task's new state. Callers validate the decision's arguments before their first write.
local DECISIONS = {[''] = 'failed', wait = 'failed', retry = 'backoff', stop = 'blocked', quarantine = 'quarantined'}
local function decision_args()
  return {
    {'decision', 'enum', '', 'wait', 'retry', 'stop', 'quarantine'},
    {'why', 'text', 2000},
    {'next_reason', 'text', 2000},
    {'next_hypothesis', 'text', 2000},
    {'delay_ms', 'int', 0, 365 * DAY_MS},
    {'attention', 'json?', 262144, 'obj'},
    {'budget', 'enum', '', 'attempts', 'same_fingerprint', 'cost', 'tokens', 'wall_time', 'interruptions',
     'cost_or_tokens'},
  }
end

-- A failure record as the Failure model reads it back: its class and fingerprint the ones the
-- script records beside it; nil when fine, else the E_BADARG reply.
local function failure_error(text, fclass, fingerprint)
  local fields = {failure_class = 'string', type = 'string', message = 'string', fingerprint = 'string',
                  retryable = 'boolean'}
  local f = cjson.decode(text)
  for k, v in pairs(f) do
    local want = fields[k]
    if not want or (type(v) ~= want and v ~= cjson.null) then
      return {'E_BADARG', 'failure: field ' .. tostring(k) .. ' is not part of a failure record, or has the wrong type'}
    end
  end
  if f.failure_class ~= fclass or f.fingerprint ~= fingerprint or type(f.type) ~= 'string' or f.type == '' then
    return {'E_BADARG', 'failure: its failure_class, fingerprint and type must be the ones recorded beside it'}
  end
  return nil
end

-- The decision's own consistency (after args() checked each field); nil when fine.
local function decision_error(A)
  if A.decision == 'retry' and chars(A.next_reason) < 10 then
    return {'E_BADARG', 'next_reason: a retry decision needs a reason of at least ten characters'}
  end
  if (A.decision == 'stop' or A.decision == 'quarantine') and A.attention == '' then
    return {'E_BADARG', 'attention: a stop or quarantine decision needs an attention item'}
  end
  return nil
end

local function apply_decision(K, task_id, queue, n, from_state, d, actor, ts)
  local state = DECISIONS[d.decision]
  if d.decision ~= '' and d.decision ~= 'wait' then
    redis.call('HINCRBY', K.stats, 'decision:' .. d.decision .. ':' .. (d.fclass or ''), 1)
  end
  if d.budget ~= '' then redis.call('HINCRBY', K.stats, 'budget_exhausted:' .. d.budget, 1) end
  if d.decision == 'retry' then
    local m = tonumber(n) + 1
    local due = ts + d.delay_ms
    if d.delay_ms <= 0 then state = 'pending' end
    local _, reason = chars(d.next_reason)
    aset(K.attempts, m, {'state', 'pending', 'created_at', ts, 'due_at', due, 'prev', n, 'reason', reason,
      'hypothesis', d.next_hypothesis, 'manifest', redis.call('HGET', K.task, 'manifest'),
      'worktree', task_id .. '/' .. m, 'retry_by', actor})
    redis.call('HSET', K.task, 'state', state, 'attempts', m, 'active', m, 'updated_at', ts)
    redis.call('ZADD', K.pending, due, task_id)
    redis.call('ZADD', K.outbox, due, task_id .. '/' .. m)
    emit(K.events, 'attempt_created', {'attempt', m, 'retry_of', n, 'actor', actor, 'reason', reason,
      'hypothesis', d.next_hypothesis, 'due_at', due, 'delay_ms', d.delay_ms, 'decision', d.why})
  else
    redis.call('HSET', K.task, 'state', state, 'active', '', 'updated_at', ts)
    if d.decision == 'stop' or d.decision == 'quarantine' then
      redis.call('HSET', K.attention, task_id, d.attention)
      emit(K.events, 'attention_raised', {'attempt', n, 'actor', actor, 'reason', d.why, 'budget', d.budget})
    end
    if d.decision == 'quarantine' then
      redis.call('ZADD', K.dlq, ts, task_id)
      emit(K.events, 'task_quarantined', {'attempt', n, 'actor', actor, 'reason', d.why})
    end
  end
  move_count(K.counts, queue, from_state, state)
  return state
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
