-- mc_queue: fair_take
-- Take one message out of an RQ queue's fair lanes without serving it: the sweeper's priority aging moves a
-- message that waited long enough to its key's lane of a more urgent RQ queue (then fair_push.lua there, in
-- a MULTI with its job's origin and a ticket). Only the head of its lane is taken (aging looks at the
-- oldest message of each lane, and the lanes keep no holes); its key keeps its pass, as if it had not been
-- in line at all, and leaves the turns when its lane is empty (remembering the pass, as fair_pop.lua does).
-- KEYS[1] lanes      the RQ queue's fair lanes (fair_push.lua)
-- KEYS[2] turns      the keys with messages queued -> their pass
-- ARGV[1] job_id     the RQ job id of the message (transport.job_id: 'mcq-' and [A-Za-z0-9_-])
-- Returns: {'OK', key} (taken: it is in no lane now) | {'NOOP', why} (not at the head of a lane here: a worker
--          took it, or it was never queued here; nothing written) | {'E_BADARG', why}
-- Events: none (a transport message, not a decision)
-- Idempotent: yes (a resend finds it gone: NOOP)
--@include common

local K = {lanes = KEYS[1], turns = KEYS[2]}
local A, bad = args(ARGV, {
  'job_id', 'id', 200, false,
})
if bad then return bad end
if not string.match(A.job_id, '^mcq%-[%w_%-]+$') then
  return {'E_BADARG', 'job_id must be an RQ job id mc_queue made (mcq-<letters, digits, _ or ->)'}
end
local at = redis.call('HGET', K.lanes, 'j:' .. A.job_id)
local key, seq = string.match(at or '', '^(.+)|(%d+)$')
if not key then return {'NOOP', 'not queued in these lanes'} end
local ends = redis.call('HMGET', K.lanes, key .. '|h', key .. '|t')
local h, t = tonumber(ends[1]), tonumber(ends[2])
if not h or not t or tonumber(seq) ~= h or redis.call('HGET', K.lanes, key .. '|' .. seq) ~= A.job_id then
  return {'NOOP', 'not at the head of its lane'}
end
redis.call('HDEL', K.lanes, key .. '|' .. seq, 'j:' .. A.job_id)
if h < t then
  redis.call('HSET', K.lanes, key .. '|h', h + 1)
else  -- the lane is empty now: the key leaves the turns and keeps its pass
  local pass = redis.call('ZSCORE', K.turns, key)
  redis.call('ZREM', K.turns, key)
  redis.call('HDEL', K.lanes, key .. '|h', key .. '|t')
  if pass then redis.call('HSET', K.lanes, key .. '|p', pass) end
end
return {'OK', key}
