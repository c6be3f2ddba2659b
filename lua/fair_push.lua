-- mc_queue: fair_push
-- Queue one RQ job id in its fairness key's lane of an RQ queue (a queue's priority): sent by dispatch in the
-- same MULTI as RQ's job record and the ticket ('mcq-fair') it pushes on the RQ queue itself, so a worker
-- blocked on the RQ queue wakes as before and takes the lane fair_pop.lua chooses. A key with nothing
-- queued joins the turns at the pass the lanes are at now (the lowest queued key's, or the last one
-- served), or its own pass if it left later (it was served last just before it emptied): a key that comes
-- and goes gets no more than one with a backlog.
-- KEYS[1] lanes      the RQ queue's fair lanes (keys.py: "<key>|h", "<key>|t", "<key>|<seq>", "j:<job id>",
--                    "<key>|p", "vt")
-- KEYS[2] turns      the keys with messages queued -> their pass
-- ARGV[1] lane       the task's fairness key
-- ARGV[2] job_id     the RQ job id of the Attempt's message
-- Returns: {'OK', seq} (its place in the lane) | {'E_BADARG', why}
-- Events: none (a transport message, not a decision: the Attempt's dispatch is recorded by mark_dispatched)
-- Idempotent: no (a resend queues the message twice: a message delivered twice is refused by the claim)
--@include common

local K = {lanes = KEYS[1], turns = KEYS[2]}
local A, bad = args(ARGV, {
  'lane', 'lkey', false, false,
  'job_id', 'id', 200, false,
})
if bad then return bad end
if string.find(A.job_id, '|', 1, true) then return {'E_BADARG', 'job_id must not contain |'} end
local seq = redis.call('HINCRBY', K.lanes, A.lane .. '|t', 1)
if not redis.call('HGET', K.lanes, A.lane .. '|h') then redis.call('HSET', K.lanes, A.lane .. '|h', seq) end
redis.call('HSET', K.lanes, A.lane .. '|' .. seq, A.job_id, 'j:' .. A.job_id, A.lane .. '|' .. seq)
if not redis.call('ZSCORE', K.turns, A.lane) then
  local low = redis.call('ZRANGE', K.turns, 0, 0, 'WITHSCORES')
  local now = tonumber(low[2] or redis.call('HGET', K.lanes, 'vt') or 0)
  local own = tonumber(redis.call('HGET', K.lanes, A.lane .. '|p') or 0)
  redis.call('ZADD', K.turns, math.max(now, own), A.lane)
  redis.call('HDEL', K.lanes, A.lane .. '|p')
end
return {'OK', seq}
