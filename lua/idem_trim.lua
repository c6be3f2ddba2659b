-- mc_queue: idem_trim
-- Drop the producer keys of retired or purged tasks once their tombstone window has passed, so the
-- idempotency hash holds live tasks and remembered tombstones only (the sweeper, each pass). An entry
-- the same key was given again since (a new task) is kept: only one still marked purged, with a
-- window that has ended, goes.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] idem       producer idempotency keys
-- KEYS[5] idem_until retired producer keys -> when their entry may go (ms)
-- ARGV[1] limit      at most this many keys looked at
-- ARGV[2] epoch
-- ARGV[3] actor
-- Returns: {'OK', dropped, looked_at} | {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events: none
-- Idempotent: yes
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], idem = KEYS[4], idem_until = KEYS[5]}
local A, bad = args(ARGV, {
  'limit', 'int', 1, 10000,
  'epoch', 'epoch', false, false,
  'actor', 'id', 200, false,
})
if bad then return bad end
local err = ns_check(meta_read(K.meta), K.meta, K.epochs, K.nslog, A.epoch, 0, A.actor, false)
if err then return err end
local ts = now_ms()
local due = redis.call('ZRANGEBYSCORE', K.idem_until, '-inf', ts, 'LIMIT', 0, A.limit)
local dropped = 0
for _, key in ipairs(due) do
  local entry = redis.call('HGET', K.idem, key)
  local until_ms = entry and string.match(entry, ' purged (%d+)$')
  if until_ms and tonumber(until_ms) <= ts then
    redis.call('HDEL', K.idem, key)
    dropped = dropped + 1
  end
  redis.call('ZREM', K.idem_until, key)
end
return {'OK', dropped, #due}
