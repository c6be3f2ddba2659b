-- mc_queue: claim
-- Take the task's pending Attempt: issue the next fence (HINCRBY of the task's fence counter, raised
-- above the namespace floor), and take the lease: a key of its own set with PX from Redis's clock
-- (its existence is the lease), indexed by expiry for the sweeper. A second caller is refused,
-- never given a lease. The lease length is the task's, frozen at enqueue, unless the caller asks
-- for one (never above the namespace ceiling). Counts the Attempt's wait (due time to claim) in stats.
-- A scheduled or backoff task's Attempt is refused before its due time ('not due'), and a task's first
-- Attempt after the task's start_by deadline (the sweeper cancels such a task).
-- A claimable Attempt of a paused queue is refused (E_CLAIM 'queue <q> is paused'); the task stays pending.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] counts     "<queue>|<state>" counters
-- KEYS[5] leases     lease expiry index
-- KEYS[6] task       task hash
-- KEYS[7] attempts   attempts hash
-- KEYS[8] events     task event stream
-- KEYS[9] pending    the queue's pending index
-- KEYS[10] stats     counters for metrics (refusals, expiries, decisions; here also the wait histogram:
--                    wait|<queue>|<handler>|<bucket>, wait_ms|<queue>|<handler>)
-- KEYS[11] fence     the task's fence counter
-- KEYS[12] lease     the task's lease key ("<attempt>:<fence>", PX lease length)
-- KEYS[13] paused    paused queues (queue_pause.lua): a paused queue's Attempts are refused
-- KEYS[14] limits    rate limits (limit_admin.lua): "<key>" -> "<limit> <window_ms> <source>", "<key>|used",
--                    "<key>|paused", "<key>|why", "<key>|next" (the next free slot of a deferred Attempt);
--                    its circuit breaker: "<key>|breaker" (its setting), "<key>|bstate" ("open <until ms>" |
--                    "half <probes out> <probes that succeeded> <last probe admitted, ms>", absent: closed),
--                    "<key>|bwhy"; its concurrency slots: "<key>|slots" ("<slots> <on full> <source>", or the family's
--                    "<family>:*|slots"), "<key>|wfence" (its writer fence, one more at each slot taken); its spend
--                    ceiling: "<key>|spend" ("<cost> <tokens> <window ms> <on over> <source>", or the family's
--                    "<family>:*|spend"), "<key>|snext" (the next recheck of an Attempt deferred by it); its
--                    declared fallbacks: "<key>|fallbacks" ("<fallback key>,... <source>")
-- KEYS[15] done      the queue's finished tasks (a task rejected by a full concurrency key ends here)
-- KEYS[16] held      the queue's tasks waiting for a person
-- KEYS[17] released  tasks that ended with dependents waiting
-- KEYS[18] slotheld  concurrency slots held: "<key>\n<claimed at ms, 15 digits>\n<attempt id>" (score 0)
-- KEYS[19] slotwait  Attempts waiting for a slot: "<key>\n<place, 15 digits>\n<queue>\n<task id>" (score 0)
-- KEYS[20] spent     spend ceilings' reservations and buckets (score 0, by text: common.lua spend_settle)
-- ITEMKEYS[1] log    each of the task's rate limits' admission log ("<attempt id> <cost>" -> ms), in the order
--                    the task's 'limits' field names them (none for a task without limits)
-- ARGV[1] worker     worker id
-- ARGV[2] lease_ms   lease length, or '' for the task's own
-- ARGV[3] epoch      namespace epoch the client knows
-- ARGV[4] min_seq    highest claim sequence this client has seen (state-loss detection)
-- ARGV[5] request_id the caller's id for this claim; a resend returns the same lease
-- ARGV[6] expect_n   the attempt number the caller was sent to run, or '' for whichever is pending
-- ARGV[7] with_task  '1': the reply also holds the task's hash and its attempts hash (what a worker about
--                    to run the Attempt reads: one round trip less), '' not
-- ARGV[8] budget_ms  the Attempt's timeout budget (ms; the task's timeout_s, which the worker enforces), or ''
--                    for none: the Attempt's deadline is now + budget_ms on Redis's clock, never after the
--                    task's finish_by (which alone sets it when budget_ms is ''); recorded as its 'deadline'
-- ITEMARGV[1] limit_key  that limit's key (the task's: a list that differs is refused, E_LIMITKEYS)
-- Rate limits: a task that names limits ('limits' field, enqueue) is claimed only when each configured one
-- has room for its cost in the sliding window ending now (Redis clock) and none is paused: then every
-- one takes its units (an entry in its log), all or none. Otherwise the Attempt is not claimed: it stays
-- pending with no lease, due again when its units return (E_LIMITED), its dispatch record cleared so the
-- sweeper sends it then. Deferred Attempts of a key are due one slot (window / limit * cost) apart from
-- its 'next': a backlog does not wake all at once for one returning unit (which would cost a claim per
-- waiting Attempt per unit), and a limit used in a burst is used evenly after it. A key with no limit set is not limited (a pause still holds it).
-- Concurrency keys (bulkheads): a key with slots set (its own or its family's) admits at most that many
-- running Attempts; each claimed one holds a slot (cost 0 takes none) until it stops running (complete, fail,
-- expire, cancel_ack return it: slots_free), and gets the key's next writer fence ('slots': "<key> <fence>",
-- for the provider to refuse an older writer). A full key: 'wait' parks the Attempt (pending, not due for
-- PARK_MS, in line in slotwait: the first slot returned wakes it, keeping its place when it must wait
-- again); 'supersede' parks it too and names the oldest holder for the caller to cancel; 'reject' cancels the
-- task (E_REJECTED). Parking wins over a rate limit's deferral (its units are checked when it wakes).
-- Fallbacks: a key whose breaker is down (open, or half-open with every probe out) does not hold the claim
-- when one of its declared fallbacks ("<key>|fallbacks") is named by the task too and its own breaker is
-- closed (or its open time is over): the Attempt is claimed, recording 'admitted_via' ("<key>><fallback>"),
-- and its handler's call goes to the fallback (limit_stamp.lua records the switch). A last fallback '-' (the
-- step can be skipped) is always up: claimed with 'admitted_via' "<key>>-" when no fallback before it is; and
-- a fallback of such a key, named only as a dependency, does not hold the claim when it is down itself.
-- Spend ceilings (denial of wallet): a key with a ceiling set (its own or its family's: cost and/or tokens per
-- window) admits an Attempt only when what the key's Attempts spent in the window ending now, plus what its
-- running Attempts reserved, plus this Attempt's estimate stays within it (with an estimate of 0, while
-- anything is left). The estimate is what the task's budget has left (max_cost, max_tokens, less what its
-- earlier Attempts were charged; 0 for no budget). Admitted, the Attempt reserves its estimate ('spend':
-- "<key> <cost> <tokens> <bucket ms>"), replaced by what it was charged when it stops running. Over: 'wait'
-- defers it like a rate limit (due when enough leaves the window, or a recheck while reservations block:
-- Attempts deferred by a key are due one estimate's share of the window apart), 'reject' cancels the task.
-- Returns: {'OK', n, fence, lease_exp_ms, seq, now_ms, lease_ms, recovered_at, deadline_ms[, task, attempts]}
--          | {'DUP', ...same...}  (deadline_ms: '' when the Attempt has none)
--          | {'E_LIMITED', why, due_ms, supersede} (over a rate limit or paused: offered again at due_ms; or
--            waiting for a concurrency slot: supersede is the holder's attempt id to cancel, or '')
--          | {'E_REJECTED', why} (a concurrency key that rejects when full is full: the task is canceled)
--          | {'E_LIMITKEYS', limits} (the logs given are not the task's limits: its 'limits' field, to send again)
--          (recovered_at: when the namespace was last recovered, ms, or '': a task created before it may
--          have lost effect records, so its worker asks the provider before each first call; task and
--          attempts: HGETALL of each, as they are after the claim, with with_task; attempts is empty
--          when the task hash holds them, as every task written since 2026-12 does)
--          {'E_CLAIM', why, holder} | {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current}
--          {'E_BADARG', why}
-- Events: attempt_claimed | claim_refused | claim_limited | task_canceled | breaker_half_open (nslog)
-- Idempotent: by request id
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], counts = KEYS[4], leases = KEYS[5],
  task = KEYS[6], attempts = KEYS[7], events = KEYS[8], pending = KEYS[9],
  stats = KEYS[10], fence = KEYS[11], lease = KEYS[12], paused = KEYS[13], limits = KEYS[14], done = KEYS[15],
  held = KEYS[16], released = KEYS[17], slotheld = KEYS[18], slotwait = KEYS[19], spent = KEYS[20]}
local PARK_MS = 300000  -- a parked Attempt's due time: what a wake that never came would cost
local SPEND_RECHECK_MS = 5000  -- a spend ceiling held by reservations: when a deferred Attempt looks again
bind_task(K)
local A, bad = args(ARGV, {
  'worker', 'id', 200, false,
  'lease_ms', 'int?', 1, MAX_INT,
  'epoch', 'epoch', false, false,
  'min_seq', 'int', 0, MAX_INT,
  'request_id', 'reqid', false, false,
  'expect_n', 'int?', 1, MAX_N,
  'with_task', 'enum', '||1|', false,
  'budget_ms', 'int?', 1, MAX_INT,
}, {'limit_key', 'lkey', false, false}, 0, true)
if bad then return bad end
local ITEMS = each_keys(KEYS, 21, {'log'}, #A.items)
if not ITEMS then return {'E_BADARG', 'expected a log key for each of the ' .. #A.items .. ' limits'} end
for i, I in ipairs(A.items) do
  local K = ITEMS[i]  -- (the item's keys)
  if string.sub(K.log, -(#I.limit_key + 7)) ~= ':limit:' .. I.limit_key then
    return {'E_BADARG', 'item ' .. i .. ': log is not the log of limit ' .. I.limit_key, i}
  end
end

local function with_task(reply)
  if A.with_task == '1' then
    reply[#reply + 1] = redis.call('HGETALL', K.task)  -- (with its Attempts, unless they have a hash of their own)
    reply[#reply + 1] = K.attempts ~= K.task and redis.call('HGETALL', K.attempts) or {}
  end
  return reply
end

local m = meta_read(K.meta, true)
if A.lease_ms and A.lease_ms > m.max_lease then
  return {'E_BADARG', 'lease_ms ' .. fmt(A.lease_ms) .. ' is above the namespace ceiling of ' .. fmt(m.max_lease) .. ' ms'}
end
local err = ns_check(m, K.meta, K.epochs, K.nslog, A.epoch, A.min_seq, A.worker, false)
if err then return err end

local t = redis.call('HMGET', K.task, 'state', 'attempts', 'queue', 'id', 'lease_ms', 'handler', 'fence', 'created_at',
  'start_by', 'finish_by', 'limits', 'budget')
if not t[1] then return {'E_NOTASK', 'no such task'} end
local state, n, queue, task_id = t[1], t[2], t[3], t[4]
local lease_ms, lease_s = A.lease_ms, A.raw.lease_ms
if not lease_ms then  -- the task's own, never above the ceiling
  lease_ms = tonumber(t[5] or '')
  lease_s = t[5]
  if not lease_ms or lease_ms > m.max_lease then lease_ms, lease_s = m.max_lease, fmt(m.max_lease) end
end
local aid = task_id .. '/' .. n
-- (A hash of short fields is one listpack that every field read scans, and a field it lacks costs a
-- whole scan: what only a resend, a refusal or a task with limits needs is read only then.)
local a = redis.call('HMGET', K.attempts, n .. '.state', n .. '.due_at')
local ts = now_ms()
local due = tonumber(a[2] or t[8] or '') or 0  -- (Attempt 1 keeps no due_at: the task's created_at)

if A.request_id ~= '' and a[1] == 'running' then
  local r = redis.call('HMGET', K.attempts, n .. '.claim_req', n .. '.fence', n .. '.lease_exp', n .. '.seq',
    n .. '.lease_ms', n .. '.deadline')
  if r[1] == A.request_id then
    return with_task({'DUP', tonumber(n), r[2], r[3], r[4] or '0', ts, r[5] or '', m.recovered_at or '', r[6] or ''})
  end
end
-- How many times a limit deferred it, and its place in a slot's line: only a task with limits has them.
local lp = (t[11] and t[11] ~= '') and redis.call('HMGET', K.attempts, n .. '.limited', n .. '.parked') or {}

local wanted = parse_limits(t[11] or '') or {}
local same, named = #wanted == #A.items, {}
for i, w in ipairs(wanted) do same, named[w[1]] = same and A.items[i].limit_key == w[1], true end
if not same then return {'E_LIMITKEYS', t[11] or ''} end

local why = nil
if A.expect_n and A.raw.expect_n ~= n then
  why = 'sent to run attempt ' .. A.raw.expect_n .. ' but the task is at attempt ' .. n
elseif state ~= 'pending' and state ~= 'backoff' and state ~= 'scheduled' then
  why = 'task is ' .. state
elseif a[1] ~= 'pending' then
  why = 'attempt ' .. n .. ' is ' .. tostring(a[1])
elseif due > ts then
  why = 'attempt ' .. n .. ' is not due for ' .. fmt(due - ts) .. ' ms'
elseif t[9] and n == '1' and ts > (tonumber(t[9]) or 0) then
  why = 'the task missed its start_by deadline (' .. t[9] .. ' ms, Redis clock): the sweeper cancels it'
elseif redis.call('HEXISTS', K.paused, queue) == 1 then
  why = 'queue ' .. queue .. ' is paused'
end
if why then
  local holder = aget(K.attempts, n, 'worker') or ''
  return refuse(K.events, K.stats, 'claim_refused', {'E_CLAIM', why, holder},
    {'attempt', n, 'worker', A.worker, 'reason', why, 'holder', holder})
end

-- Rate limits, read only: each limit's units in the window ending now (its running total less the entries
-- that left the window), and when the units this task needs come back (the oldest entries in the window).
-- (In these loops K is a limit's: its log, and the namespace's limits hash and stats.)
for _, it in ipairs(ITEMS) do
  it.limits, it.stats, it.nslog, it.slotheld, it.spent = K.limits, K.stats, K.nslog, K.slotheld, K.spent
end
local plan, over_at, over_why, full, est = {}, nil, nil, nil, nil
-- A spend ceiling's estimate of this Attempt: what the task's budget has left (thousandths of cost, tokens).
local function estimate()
  local ok, b = pcall(cjson.decode, long_value(K.task, 'budget', t[12]) or '')  -- (a long one is in chunks)
  local max_cost = ok and type(b) == 'table' and tonumber(b.max_cost) or nil
  local max_tokens = ok and type(b) == 'table' and tonumber(b.max_tokens) or nil
  local cost, tokens = max_cost and math.min(max_cost, 1e12) or 0, max_tokens and math.min(max_tokens, 1e15) or 0
  local num = tonumber(n)
  if num > 1 and (cost > 0 or tokens > 0) then  -- less what its earlier Attempts were charged
    local f = {}
    for i = 1, math.min(num - 1, 1000) do f[#f + 1] = i .. '.cost' ; f[#f + 1] = i .. '.tokens' end
    local v = redis.call('HMGET', K.attempts, unpack(f))
    for i = 1, #v, 2 do cost, tokens = cost - (tonumber(v[i] or '0') or 0), tokens - (tonumber(v[i + 1] or '0') or 0) end
  end
  return {cost = math.ceil(math.max(0, cost) * 1000 - 1e-6), tokens = math.max(0, math.floor(tokens))}
end
-- A key named only as a dependency (cost 0) that is a declared fallback of another key the task names, whose
-- last fallback is '-' (its step can be skipped): that key down does not hold the claim on its own account.
local function skip_covers(K, x)
  for _, w in ipairs(wanted) do
    if w[1] ~= x then
      local fl = string.match(redis.call('HGET', K.limits, w[1] .. '|fallbacks') or '', '^(%S+)') or ''
      if string.sub(fl, -2) == ',-' and string.find(',' .. fl .. ',', ',' .. x .. ',', 1, true) then return true end
    end
  end
  return false
end
for i, w in ipairs(wanted) do
  local K = ITEMS[i]
  local name, cost = w[1], w[2]
  local fam = slot_family(name)
  local c = redis.call('HMGET', K.limits, name, name .. '|used', name .. '|paused', name .. '|why', name .. '|next',
    name .. '|bstate', name .. '|breaker', name .. '|bwhy', name .. '|slots', fam and (fam .. '|slots') or name .. '|slots',
    name .. '|spend', fam and (fam .. '|spend') or name .. '|spend', name .. '|snext', name .. '|fallbacks')
  local st = {name = name, cost = cost, K = K, next = tonumber(c[5] or '')}
  local lim, win = string.match(c[1] or '', '^(%d+) (%d+)')
  st.lim, st.win = tonumber(lim), tonumber(win)
  if cost == 0 then st.lim = nil end  -- (a dependency only: no units taken)
  local at, why_l, kind = nil, nil, 'rate limit '
  local paused = tonumber(c[3] or '')
  local bkind, b1, b2, b3 = string.match(c[6] or '', '^(%a+) (%d+) ?(%d*) ?(%d*)$')
  local bset = breaker_setting(c[7]) or {probes = 1, open_ms = 30000}  -- (opened by hand, never set: defaults)
  local probes, open_ms = bset.probes, bset.open_ms
  if bkind == 'open' and tonumber(b1) <= ts then  -- its open time is over: half-open, no probe admitted yet
    bkind, b1, b2 = 'half', '0', '0'
    st.half_opened = true
  end
  if bkind == 'half' and tonumber(b1) >= probes and b3 ~= '' and ts - tonumber(b3) > 2 * open_ms then
    -- every probe is out, and none reported for twice the open time (its worker died, or it hangs):
    -- the breaker must not wait on them for ever, so it admits new probes
    b1 = '0'
    st.half_opened = true
  end
  if bkind == 'open' then
    at, kind = tonumber(b1), 'circuit breaker '
    why_l = 'open until ' .. b1 .. ' ms (Redis clock): ' .. (c[8] or '')
  elseif bkind == 'half' and tonumber(b1) >= probes then  -- every probe is out: wait for their outcome
    at, kind = ts + math.max(250, math.floor(open_ms / 4)), 'circuit breaker '
    why_l = 'half-open, its ' .. probes .. ' probe Attempt(s) out: ' .. (c[8] or '')
  elseif bkind == 'half' then
    st.probe, st.probes_out, st.probes_ok = true, tonumber(b1) + 1, b2 ~= '' and b2 or '0'
  end
  if at then  -- down: unless the task names one of its declared fallbacks, and that one is up
    for fb in string.gmatch(string.match(c[14] or '', '^(%S+)') or '', '[^,]+') do
      if fb == '-' and not st.fallback then st.fallback = fb end  -- (last: the step can be skipped)
      if named[fb] and not st.fallback then
        local fs = redis.call('HGET', K.limits, fb .. '|bstate')
        local fkind, funtil = string.match(fs or '', '^(%a+) (%d+)')
        if not fkind or (fkind == 'open' and tonumber(funtil) <= ts) then st.fallback = fb end
      end
    end
    if st.fallback or (cost == 0 and skip_covers(K, name)) then at = nil else st.breaker = true end
  end
  if st.breaker then
  elseif paused and paused > ts then
    at, why_l = paused, 'paused until ' .. c[3] .. ' ms (Redis clock): ' .. (c[4] or '')
  elseif st.lim then
    local inwin, old = window_units(K, tonumber(c[2] or '0') or 0, st.win, ts)
    st.inwin, st.old = inwin, old
    if inwin + cost > st.lim then
      why_l = inwin .. ' of ' .. st.lim .. ' units used in the last ' .. st.win .. ' ms, ' .. cost .. ' wanted'
      if cost > st.lim then
        at, why_l = ts + st.win, 'a cost of ' .. cost .. ' is above the limit of ' .. st.lim .. ' per ' .. st.win ..
          ' ms: never admitted until the limit is raised'
      else  -- when enough units leave the window: the oldest entries in it, in order
        local need, freed = inwin + cost - st.lim, 0
        local e = redis.call('ZRANGEBYSCORE', K.log, '(' .. fmt(ts - st.win), '+inf', 'WITHSCORES', 'LIMIT', 0, need)
        for j = 1, #e, 2 do
          freed = freed + (tonumber(string.match(e[j], ' (%d+)$')) or 0)
          at = tonumber(e[j + 1]) + st.win
          if freed >= need then break end
        end
        if freed < need then at = ts + st.win end  -- (a running total ahead of its log: the window clears it)
        st.slotted = true
      end
    end
  end
  if at then
    st.over = true
    if not over_at or at > over_at then over_at, over_why = at, kind .. name .. ': ' .. why_l end
  end
  local slots = cost > 0 and (slot_setting(c[9]) or slot_setting(c[10])) or nil
  if slots then
    local lo, hi = slot_range(name)
    local running = redis.call('ZLEXCOUNT', K.slotheld, lo, hi)
    if running >= slots.slots then
      if not full or (slots.on_full == 'reject' and full.on_full ~= 'reject') then
        full = {name = name, on_full = slots.on_full, lo = lo, hi = hi,
          why = 'concurrency key ' .. name .. ': ' .. running .. ' of ' .. slots.slots .. ' slots held'}
      end
    else
      st.slot = true
    end
  end
  local ceiling = spend_setting(c[11]) or spend_setting(c[12])
  if ceiling then  -- a spend ceiling: what was spent in its window, what is reserved, and this estimate
    est = est or estimate()
    local u = spend_used(K, name, ceiling.win, ts)
    st.spend, st.stale, st.width = true, u.stale, spend_bucket_ms(ceiling.win)
    for _, d in ipairs({{'cost (thousandths)', ceiling.cost, u.cost, u.held_cost, est.cost, 2},
                        {'tokens', ceiling.tokens, u.tokens, u.held_tokens, est.tokens, 3}}) do
      local what, cap, used, held, want = d[1], d[2], d[3], d[4], d[5]
      if cap > 0 and (used + held + want > cap or (want == 0 and used + held >= cap)) and not st.spend_over then
        local s_at
        local s_why = 'spend ceiling ' .. name .. ': ' .. what .. ' ' .. fmt(used) .. ' spent in the last ' ..
          ceiling.win .. ' ms and ' .. fmt(held) .. ' reserved by running Attempts, of ' .. fmt(cap) ..
          '; this Attempt may spend ' .. fmt(want)
        if want > cap then
          s_at, s_why = ts + ceiling.win, 'spend ceiling ' .. name .. ': this Attempt may spend ' .. fmt(want) ..
            ' ' .. what .. ', above the ceiling of ' .. fmt(cap) .. ' per ' .. ceiling.win ..
            ' ms: never admitted until the ceiling is raised or its budget lowered'
        elseif used + math.max(want, 1) > cap then  -- what was spent blocks: when its oldest buckets leave
          local need, freed = used + math.max(want, 1) - cap, 0
          s_at = ts + ceiling.win
          for _, b in ipairs(u.buckets) do
            freed = freed + b[d[6]]
            if freed >= need then s_at = b[1] ; break end
          end
        else  -- running Attempts' reservations block: look again when some may have ended
          s_at = ts + math.min(ceiling.win, SPEND_RECHECK_MS)
        end
        st.spend_over, st.snext = true, tonumber(c[13] or '')
        st.spacing = math.max(50, math.ceil(ceiling.win * math.max(want, 1) / cap))
        if ceiling.on_over == 'reject' then
          if not full or full.on_full ~= 'reject' then
            full = {name = name, on_full = 'reject', why = s_why, stat = 'spend_rejected|'}
          end
        else
          if st.snext and st.snext > s_at then s_at = st.snext end
          st.over = true
          if not over_at or s_at > over_at then over_at, over_why = s_at, s_why end
        end
      end
    end
  end
  plan[i] = st
end
if full and full.on_full == 'reject' then  -- the newest is rejected: the task ends, canceled, and says why
  local why = full.why .. (full.stat and ' (rejects when over)' or ' (rejects when full)')
  local ts_s = fmt(ts)
  aset(K.attempts, n, {'state', 'canceled', 'ended_at', ts_s, 'settled_by', 'cancel'})
  if lp[2] then redis.call('ZREM', K.slotwait, lp[2]) ; redis.call('HDEL', K.attempts, n .. '.parked') end
  redis.call('ZREM', K.pending, task_id)
  redis.call('HSET', K.task, 'state', 'canceled', 'active', '', 'cancel_requested', why, 'cancel_at', ts_s,
    'cancel_by', A.worker, 'updated_at', ts_s)
  move_count(K.counts, queue, state, 'canceled', K.task)
  index_end(K, task_id, state, 'canceled', ts)
  redis.call('HINCRBY', K.stats, (full.stat or 'slot_rejected|') .. full.name, 1)
  emit(K.events, 'task_canceled', {'attempt', n, 'actor', A.worker, 'reason', why})
  return {'E_REJECTED', why}
elseif full then
  -- Parked: in line for the key's next free slot (keeping its place if it was in line already), not due
  -- until then; 'supersede' also names the oldest holder, for the caller to cancel.
  local place = string.match(lp[2] or '', '^[^\n]+\n(%d+)\n') or slot_pad(redis.call('HINCRBY', K.meta, 'slot_seq', 1))
  local member = full.name .. '\n' .. place .. '\n' .. queue .. '\n' .. task_id
  if lp[2] and lp[2] ~= member then redis.call('ZREM', K.slotwait, lp[2]) end
  redis.call('ZADD', K.slotwait, 0, member)
  local supersede = ''
  if full.on_full == 'supersede' then
    local h = redis.call('ZRANGEBYLEX', K.slotheld, full.lo, full.hi, 'LIMIT', 0, 1)[1]
    supersede = h and string.match(h, '\n%d+\n(.+)$') or ''
  end
  local due_s = fmt(ts + PARK_MS)
  aset(K.attempts, n, {'due_at', due_s, 'limited', (tonumber(lp[1] or '0') or 0) + 1, 'limited_by', full.why,
    'parked', member})
  redis.call('HDEL', K.attempts, n .. '.dispatched_at')
  redis.call('ZADD', K.pending, 'XX', due_s, task_id)
  redis.call('HINCRBY', K.stats, 'slot_waited|' .. full.name, 1)
  emit(K.events, 'claim_limited', {'attempt', n, 'worker', A.worker, 'reason', full.why, 'due_at', due_s,
    'key', full.name, 'supersede', supersede})
  return {'E_LIMITED', full.why, due_s, supersede}
end
if over_at then
  -- Offered again when its units return (the latest of its limits'), never before the next free slot.
  for _, st in ipairs(plan) do
    if st.slotted and st.next and st.next > over_at then over_at = st.next end
  end
  local due_s = fmt(over_at)
  for _, st in ipairs(plan) do
    local K = st.K
    if st.slotted then
      redis.call('HSET', K.limits, st.name .. '|next', fmt(over_at + math.ceil(st.win * st.cost / st.lim)))
    end
    if st.spend_over then redis.call('HSET', K.limits, st.name .. '|snext', fmt(over_at + st.spacing)) end
    if st.over then
      redis.call('HINCRBY', K.stats, (st.breaker and 'breaker_deferred|' or st.spend_over and 'spend_deferred|' or
        'limited|') .. st.name, 1)
    end
  end
  aset(K.attempts, n, {'due_at', due_s, 'limited', (tonumber(lp[1] or '0') or 0) + 1, 'limited_by', over_why})
  redis.call('HDEL', K.attempts, n .. '.dispatched_at')
  redis.call('ZADD', K.pending, 'XX', due_s, task_id)
  emit(K.events, 'claim_limited', {'attempt', n, 'worker', A.worker, 'reason', over_why, 'due_at', due_s})
  return {'E_LIMITED', over_why, due_s, ''}
end

-- (A task that keeps its Attempts in its hash was written after its fence counter moved there: no key
-- of the old kind to look for, even before its first fence.)
local fence = fmt(next_fence(K.meta, K.fence, K.task, t[7] or (K.attempts == K.task and '0' or nil)))
local seq = redis.call('HINCRBY', K.meta, 'seq', 1)
local exp = ts + lease_ms
local ts_s, exp_s = fmt(ts), fmt(exp)
-- The timeout budget: from now on Redis's clock, never past the task's finish_by.
local deadline = A.budget_ms and ts + A.budget_ms or nil
local finish_by = tonumber(t[10] or '')
if finish_by and (not deadline or finish_by < deadline) then deadline = finish_by end
local deadline_s = deadline and fmt(deadline) or ''
redis.call('SET', K.lease, n .. ':' .. fence, 'PXAT', exp_s)
redis.call('HSET', K.task, 'state', 'running', 'updated_at', ts_s)
-- (No 'hb_at' until the first renewal: until then the last heartbeat is the claim, its started_at.)
aset(K.attempts, n, {'state', 'running', 'worker', A.worker, 'fence', fence, 'lease_exp', exp_s,
  'started_at', ts_s, 'claim_req', A.request_id, 'seq', seq, 'lease_ms', lease_s,
  unpack(deadline and {'deadline', deadline_s} or {})})
redis.call('ZADD', K.leases, exp_s, aid)
redis.call('ZREM', K.pending, task_id)
-- When the outbox last handed it to the transport is said only while it waits (schedule.py's walk,
-- priority aging): a running or ended Attempt keeps its dispatch count, not the time.
redis.call('HDEL', K.attempts, n .. '.dispatched_at')
local probe, slots, spend, via = {}, {}, {}, {}
for _, st in ipairs(plan) do  -- each configured limit takes this Attempt's units; a half-open breaker a probe
  local K = st.K
  if st.half_opened then
    emit(K.nslog, 'breaker_half_open', {'key', st.name, 'actor', A.worker})
    redis.call('HINCRBY', K.stats, 'breaker_half_open|' .. st.name, 1)
  end
  if st.probe then
    redis.call('HSET', K.limits, st.name .. '|bstate', 'half ' .. st.probes_out .. ' ' .. st.probes_ok .. ' ' .. ts_s)
    probe[#probe + 1] = st.name
  end
  if st.lim then window_take(K, st.name, aid .. ' ' .. st.cost, st.cost, st.inwin, st.old, st.win, ts) end
  if st.slot then  -- a concurrency slot, and the key's next writer fence
    redis.call('ZADD', K.slotheld, 0, st.name .. '\n' .. slot_pad(ts) .. '\n' .. aid)
    slots[#slots + 1] = st.name .. ' ' .. redis.call('HINCRBY', K.limits, st.name .. '|wfence', 1)
  end
  if st.fallback then via[#via + 1] = st.name .. '>' .. st.fallback end
  if st.spend then  -- the estimate reserved (the buckets out of the window dropped)
    for _, m in ipairs(st.stale) do redis.call('ZREM', K.spent, m) end
    redis.call('ZADD', K.spent, 0, st.name .. '\n~\n' .. aid .. '\n' .. fmt(est.cost) .. ' ' .. fmt(est.tokens))
    spend[#spend + 1] = st.name .. ' ' .. fmt(est.cost) .. ' ' .. fmt(est.tokens) .. ' ' .. fmt(st.width)
  end
end
local took = {}  -- what the claim took, in one write: slots (and when), reservations, fallbacks it relied on
if #slots > 0 then took = {'slots', table.concat(slots, ','), 'slots_at', ts_s} end
if #spend > 0 then took[#took + 1], took[#took + 2] = 'spend', table.concat(spend, ',') end
if #via > 0 then took[#took + 1], took[#took + 2] = 'admitted_via', table.concat(via, ',') end
if #took > 0 then aset(K.attempts, n, took) end
if lp[2] then  -- (claimed while in line: woken, or sent again by a recheck)
  redis.call('ZREM', K.slotwait, lp[2])
  redis.call('HDEL', K.attempts, n .. '.parked')
end
move_count(K.counts, queue, state, 'running', K.task)
if #probe > 0 then aset(K.attempts, n, {'probe', table.concat(probe, ',')}) end
-- Compact ('~'): the worker, fence and lease_ms are the Attempt's, and the lease's first expiry its
-- started_at plus lease_ms; readers fill them in (mc_queue.contracts.models.filled_in).
-- Attempt 1's claim before any stored event stays implied by the hash (imply): no history key yet.
if imply(K.events, K.task, K.attempts, n, '') then
  redis.call('HSET', K.task, 'ev', 'c')
else
  emit(K.events, 'attempt_claimed', {'attempt', n, '~', '1'})
end
observe(K.stats, t[6], 'wait', queue, nil, ts - (due > 0 and due or ts))
return with_task({'OK', tonumber(n), fence, exp_s, seq, ts_s, lease_s, m.recovered_at or '', deadline_s})
