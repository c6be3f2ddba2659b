-- mc_queue: slot_audit
-- The sweeper's check that no concurrency key has a free slot while Attempts wait for it: a wake that went
-- to a waiter that then left without claiming (canceled after its wake, its send lost), a key whose slots
-- were raised or deleted. For each key with waiters (at most ARGV limit keys, in key order from ARGV
-- after), as many waiters as it has free slots are put in the wake set (slot_wake.lua makes them due). One
-- woken too many claims nothing: it finds the key full and waits again, keeping its place.
-- KEYS[1] limits     the limits hash ("<key>|slots", "<family>:*|slots")
-- KEYS[2] slotheld   concurrency slots held ("<key>\n<claimed at>\n<attempt id>", score 0)
-- KEYS[3] slotwait   Attempts waiting for a slot ("<key>\n<place>\n<queue>\n<task id>", score 0)
-- KEYS[4] slotwake   waiters to wake (scored by when)
-- ARGV[1] limit      at most this many keys
-- ARGV[2] after      the key to go on after ('' from the first)
-- Returns: {'OK', woken, next} (next: the key to go on after, '' when every key was seen)
--          | {'E_BADARG', why}
-- Events: none (slot_wake records each wake in the task's history)
-- Idempotent: yes (a waiter already in the wake set is not added twice). A run while a woken waiter's claim
--             is on its way wakes one more: it finds the key full and waits again, in its place.
--@include common

local K = {limits = KEYS[1], slotheld = KEYS[2], slotwait = KEYS[3], slotwake = KEYS[4]}
local A, bad = args(ARGV, {
  'limit', 'int', 1, 1000,
  'after', 'text', 130, false,
})
if bad then return bad end
local ts = fmt(now_ms())
local woken = 0
local next_name = each_name(K.slotwait, A.after, A.limit, function(name, lo, hi)
  local fam = slot_family(name)
  local c = redis.call('HMGET', K.limits, name .. '|slots', fam and (fam .. '|slots') or name .. '|slots')
  local s = slot_setting(c[1]) or slot_setting(c[2])
  local free = s and s.slots - redis.call('ZLEXCOUNT', K.slotheld, lo, hi) or 1000
  if free > 0 then
    for _, w in ipairs(redis.call('ZRANGEBYLEX', K.slotwait, lo, hi, 'LIMIT', 0, math.min(free, 1000))) do
      redis.call('ZREM', K.slotwait, w)
      woken = woken + redis.call('ZADD', K.slotwake, 'NX', ts, w)
    end
  end
end)
return {'OK', woken, next_name}
