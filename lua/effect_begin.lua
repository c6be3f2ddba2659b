-- mc_queue: effect_begin
-- Before a side effect: persist its intent under the orchestrator-minted key, fenced. If the key
-- already has a receipt the effect happened: the receipt is returned and the provider must not be
-- called again. If it has an intent without a receipt (a worker died mid-effect), the caller must
-- reconcile with the provider before doing anything.
-- KEYS[1] meta       namespace meta hash
-- KEYS[2] epochs     retired epochs set
-- KEYS[3] nslog      namespace event stream
-- KEYS[4] task       task hash
-- KEYS[5] attempts   attempts hash
-- KEYS[6] events     task event stream
-- KEYS[7] effects    the task's effects (key -> record JSON)
-- KEYS[8] stats      counters for metrics (refusals, expiries, decisions)
-- ARGV[1] n          attempt number
-- ARGV[2] fence      fence the caller holds
-- ARGV[3] worker     worker id
-- ARGV[4] key        operation key (minted from task, operation and content identity)
-- ARGV[5] record     intent record JSON (operation, identity, provider)
-- ARGV[6] epoch
-- ARGV[7] min_seq
-- Returns: {'OK'} (intent recorded: call the provider) | {'DONE', record} (receipt on file: replay it)
--          {'PENDING', record} (an intent without receipt: reconcile first)
--          {'E_STALE'|'E_STATE'|'E_EXPIRED', current_fence, attempt_state, lease_exp}
--          {'E_CANCELED', reason} (a cancel was requested: acknowledge instead)
--          {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_BADARG', why}
-- Events: effect_intent | effect_replayed | stale_write_refused
-- Idempotent: yes (an intent of the same attempt and fence is reported as OK again)
--@include common

local k_meta, k_epochs, k_nslog, k_task = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local k_att, k_ev, k_effects = KEYS[5], KEYS[6], KEYS[7]
local k_stats = KEYS[8]
local n, fence, worker, key, record, epoch, min_seq = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]

if key == '' then return {'E_BADARG', 'an effect needs a key'} end
local err = ns_check(k_meta, k_epochs, k_nslog, epoch, min_seq, worker, true)
if err then return err end
local ts = now_ms()
err = fence_check(k_meta, k_nslog, k_stats, k_task, k_att, k_ev, n, fence, worker, key, 'effect_begin', ts)
if err then return err end
err = cancel_check(k_task, k_ev, n, worker, key, 'effect_begin')
if err then return err end
local existing = redis.call('HGET', k_effects, key)
if existing then
  local rec = cjson.decode(existing)
  if rec.state == 'done' then
    emit(k_ev, 'effect_replayed', {'attempt', n, 'worker', worker, 'key', key, 'receipt_attempt',
      tostring(rec.receipt_attempt or rec.attempt)})
    return {'DONE', existing}
  end
  if rec.state == 'intent' and tostring(rec.attempt) == n and tostring(rec.fence) == fence then return {'OK'} end
  if rec.state ~= 'absent' then return {'PENDING', existing} end
end
local rec = cjson.decode(record)
rec.state = 'intent'
rec.attempt = tonumber(n)
rec.fence = fence
rec.worker = worker
rec.intent_at = ts
rec.key = key
redis.call('HSET', k_effects, key, cjson.encode(rec))
emit(k_ev, 'effect_intent', {'attempt', n, 'worker', worker, 'fence', fence, 'key', key,
  'operation', rec.operation or ''})
return {'OK'}
