-- mc_queue: fair_pop
-- The next message of an RQ queue's fair lanes (a worker popped a ticket, 'mcq-fair', from the RQ queue):
-- the head of the lane of the key with the lowest pass (ties by key), whose pass then grows by
-- 1,000,000 / its weight. Stride scheduling: over any run of pops while keys have messages queued, each
-- key is served in proportion to its weight, within one message of it, however deep another key's
-- backlog; a key with nothing queued leaves the turns (remembering its pass: fair_push.lua).
-- A key's weight: "<key>|weight" in the limits hash ("<weight> <source>"), else its family's
-- "<family>:*|weight", else 1.
-- KEYS[1] lanes      the RQ queue's fair lanes
-- KEYS[2] turns      the keys with messages queued -> their pass
-- KEYS[3] limits     settings: "<key>|weight"
-- ARGV[1] limit      look at this many lanes at most (an emptied lane found in the turns is dropped)
-- Returns: {'OK', job_id, key} | {'NOOP', why} (no message queued: the ticket was one too many) | {'E_BADARG', why}
-- Events: none (which message a worker takes; the claim decides and records)
-- Idempotent: no (a resend takes the next message: the one taken first is sent again by the sweeper, its
--             Attempt not claimed in time)
--@include common

local K = {lanes = KEYS[1], turns = KEYS[2], limits = KEYS[3]}
local A, bad = args(ARGV, {
  'limit', 'int', 1, 1000,
})
if bad then return bad end
local STRIDE = 1000000

local function weight(key)
  local own = redis.call('HGET', K.limits, key .. '|weight')
  if not own then
    local fam = slot_family(key)
    own = fam and redis.call('HGET', K.limits, fam .. '|weight')
  end
  return tonumber(string.match(own or '', '^(%d+)')) or 1
end

for _ = 1, A.limit do
  local low = redis.call('ZRANGE', K.turns, 0, 0, 'WITHSCORES')
  if #low == 0 then return {'NOOP', 'no message is queued in the fair lanes'} end
  local key, pass = low[1], tonumber(low[2])
  local at = redis.call('HMGET', K.lanes, key .. '|h', key .. '|t')
  local h, t = tonumber(at[1]), tonumber(at[2])
  local jid
  while h and t and h <= t and not jid do  -- (a hole would be skipped: none is made)
    jid = redis.call('HGET', K.lanes, key .. '|' .. h)
    redis.call('HDEL', K.lanes, key .. '|' .. h)
    h = h + 1
  end
  if jid and redis.call('HGET', K.lanes, 'j:' .. jid) == key .. '|' .. (h - 1) then
    redis.call('HDEL', K.lanes, 'j:' .. jid)
  end
  local after = pass + (jid and math.max(1, math.floor(STRIDE / math.max(1, weight(key)))) or 0)
  if not h or not t or h > t then  -- the lane is empty now: the key leaves the turns
    redis.call('ZREM', K.turns, key)
    redis.call('HDEL', K.lanes, key .. '|h', key .. '|t')
    redis.call('HSET', K.lanes, key .. '|p', after, 'vt', pass)
  else
    redis.call('HSET', K.lanes, key .. '|h', h)
    redis.call('ZADD', K.turns, after, key)
  end
  if jid then return {'OK', jid, key} end
end
return {'NOOP', 'no message is queued in the ' .. A.limit .. ' lanes looked at'}
