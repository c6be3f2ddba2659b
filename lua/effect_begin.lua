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
-- KEYS[9] fence      the task's fence counter
-- KEYS[10] lease     the task's lease key
-- ARGV[1] n          attempt number
-- ARGV[2] fence      fence the caller holds
-- ARGV[3] worker     worker id
-- ARGV[4] key        operation key (minted from task, operation and content identity)
-- ARGV[5] record     intent record JSON: operation (non-empty), identity, and the caller's own fields
--                    (kept as sent, in record_json)
-- ARGV[6] epoch
-- ARGV[7] min_seq
-- ARGV[8] proof      claim sequence of the fence when the caller's client was issued it, or ''
-- Returns: {'OK'} (intent recorded: call the provider) | {'DONE', record} (receipt on file: replay it)
--          {'PENDING', record} (an intent without receipt: reconcile first)
--          {'E_STALE'|'E_STATE'|'E_EXPIRED', current_fence, attempt_state, lease_exp}
--          {'E_CANCELED', reason} (a cancel was requested: acknowledge instead)
--          {'E_NOTASK', why} | {'E_NSLOST', why} | {'E_NONS', why} | {'E_BADARG', why}
-- Events: effect_intent | effect_replayed | stale_write_refused
-- Idempotent: yes (an intent of the same attempt and fence is reported as OK again)
--@include common
--@include fenced

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3], task = KEYS[4], attempts = KEYS[5],
  events = KEYS[6], effects = KEYS[7], stats = KEYS[8], fence = KEYS[9], lease = KEYS[10]}
bind_task(K)
local A, bad = args(ARGV, with({
  'n', 'int', 1, MAX_N,
  'fence', 'int', 0, MAX_INT,
  'worker', 'text', 200, false,
  'key', 'id', 512, false,
  'record', 'json', 65536, 'obj',
}, fenced_args()))
if bad then return bad end
-- The record as every reader needs it (validated before anything is written): a non-empty operation
-- and an identity, as strings, and none of the fields this script and effect_done write themselves.
local given = cjson.decode(A.record)
if type(given.operation) ~= 'string' or given.operation == '' or #given.operation > 200 then
  return {'E_BADARG', 'record: operation must be a non-empty string of at most 200 bytes'}
end
if type(given.identity) ~= 'string' or #given.identity > 4096 then
  return {'E_BADARG', 'record: identity must be a string of at most 4096 bytes'}
end
for _, f in ipairs(EFFECT_OWN_FIELDS) do
  if given[f] ~= nil then return {'E_BADARG', 'record: ' .. f .. ' is written by mc_queue, not by the caller'} end
end
local n = A.raw.n
local err, ts = fenced(K, A, A.worker, A.key, 'effect_begin', true)
if err then return err end
local existing = redis.call('HGET', K.effects, A.key)
if existing then
  local rec = cjson.decode(existing)
  if rec.state == 'done' then
    emit(K.events, 'effect_replayed', {'attempt', n, 'worker', A.worker, 'key', A.key, 'receipt_attempt',
      tostring(rec.receipt_attempt or rec.attempt)})
    return {'DONE', existing}
  end
  if rec.state == 'intent' and tostring(rec.attempt) == n and tostring(rec.fence) == A.raw.fence then return {'OK'} end
  if rec.state ~= 'absent' then return {'PENDING', existing} end
end
-- The caller's record is kept as the text it came as (record_json): cjson would turn its [] into {} and
-- its long integers into floats. The fields the scripts read are plain strings and numbers beside it.
local rec = {operation = given.operation, identity = given.identity, record_json = A.record, state = 'intent',
  attempt = A.n, fence = A.raw.fence, worker = A.worker, intent_at = ts, key = A.key}
redis.call('HSET', K.effects, A.key, cjson.encode(rec))
emit(K.events, 'effect_intent', {'attempt', n, 'worker', A.worker, 'fence', A.raw.fence, 'key', A.key,
  'operation', rec.operation or ''})
return {'OK'}
