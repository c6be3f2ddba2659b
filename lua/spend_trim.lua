-- mc_queue: spend_trim
-- The sweeper's drop of the spend ceilings' buckets that no window can count any more (claim.lua drops those
-- of a key it admits an Attempt of; a key whose tasks stopped coming would keep its last buckets for ever): a
-- bucket of width w belongs to a ceiling whose window is at most 60 w (a window's sixtieth, rounded up), so
-- one that ended more than 60 w ago is never read again. Reservations of running Attempts are never touched.
-- For each key with entries (at most ARGV limit keys, in key order from ARGV after), its stale buckets, oldest
-- first, at most 1000 a key.
-- KEYS[1] spent      spend ceilings' reservations and buckets (score 0, by text: common.lua spend_settle)
-- ARGV[1] limit      at most this many keys
-- ARGV[2] after      the key to go on after ('' from the first)
-- Returns: {'OK', dropped, next} (next: the key to go on after, '' when every key was seen) | {'E_BADARG', why}
-- Events: none (nothing a task or an operator decided changes)
-- Idempotent: yes
--@include common

local K = {spent = KEYS[1]}
local A, bad = args(ARGV, {
  'limit', 'int', 1, 1000,
  'after', 'text', 130, false,
})
if bad then return bad end
local ts = now_ms()
local dropped = 0
local next_name = each_name(K.spent, A.after, A.limit, function(_, lo, hi)
  for _, m in ipairs(redis.call('ZRANGEBYLEX', K.spent, lo, hi, 'LIMIT', 0, 1000)) do
    local s, w = string.match(m, '^[^\n]+\n(%d+)\n(%d+)\n%d+ %d+$')
    if not s or tonumber(s) + 61 * tonumber(w) >= ts then break end  -- (a reservation, or in some window)
    redis.call('ZREM', K.spent, m)
    dropped = dropped + 1
  end
end)
return {'OK', dropped, next_name}
