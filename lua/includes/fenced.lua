-- mc_queue: the fenced-write preamble, pasted after common into a script that writes under a lease
-- ("--@include fenced"). Defines no KEYS/ARGV of its own.

-- ----------------------------------------------------------------------------------- fenced writes

-- The check every fenced write (renew, complete, fail, checkpoint, effects, cancel_ack) makes before
-- writing, after the namespace check: the fence, then the Attempt's state, then the lease; a cancel
-- request too when check_cancel. Returns nil and Redis's time when the write may go on; otherwise it
-- records the refusal (a stale_write_refused event) and returns the error reply. A third value when it
-- may: the task's cancel request (its reason), or nil, as read with the rest.
-- A presented fence above the current one is evidence that Redis went back in time only when the
-- caller holds the claim record of that fence (proof: the claim sequence it was issued at) and the fence
-- lies above the namespace floor; without the record it is refused as stale ('fence_ahead'), at or
-- below the floor too ('fence_retired': an earlier incarnation's, or from before a recovery), and the
-- namespace stays ok.
-- K: meta, nslog, stats, task, attempts, events, fence, lease.
-- A: n, fence, epoch, min_seq, proof (nil when the caller has no claim record); A.raw: the same as strings.
local function fence_check(K, A, who, digest, op, check_cancel)
  local ts = now_ms()
  local n, presented = A.raw.n, A.fence
  -- One read of the task hash for what the checks below need (its Attempts are fields of it, unless
  -- it was written before 2026-12 and keeps a hash of its own).
  -- (A field the hash lacks costs a scan of it all: what only a packed task has is read only then.)
  local r = redis.call('HMGET', K.task, 'attempts', 'fence', n .. '.state', 'cancel_requested')
  local latest = r[1]
  if not latest then return {'E_NOTASK', 'no such task'} end
  local cur_s = r[2] or redis.call('GET', K.fence) or '0'  -- (fence_of: a counter of the old kind)
  local cur = (cur_s == A.raw.fence) and presented or tonumber(cur_s)
  local state = K.attempts == K.task and r[3] or (K.attempts ~= K.task and aget(K.attempts, n, 'state'))
  if not state then
    local p = redis.call('HMGET', K.task, 'packed', 'state')
    state = p[1] and p[2] or nil
  end
  local refusal, code = nil, nil
  if presented > cur then
    -- A fence at or below the namespace floor was issued before the floor was raised: by an earlier
    -- incarnation of this task id that retention deleted (retire raises the floor to its last fence),
    -- or before a recovery or a restart. It is stale, not evidence that Redis forgot it: a zombie of a
    -- retired task must not stop the namespace.
    local floor = tonumber(redis.call('HGET', K.meta, 'floor') or '0') or 0
    if presented <= floor then
      refusal, code = 'fence_retired', 'E_STALE'
    elseif A.proof then
      emit(K.events, 'state_loss_detected', {'attempt', n, 'op', op, 'presented_fence', fmt(presented),
        'current_fence', fmt(cur), 'worker', who, 'claim_seq', fmt(A.proof)})
      return mark_lost(K.meta, K.nslog, 'a worker presented fence ' .. fmt(presented) .. ' (claimed at sequence ' ..
        fmt(A.proof) .. ') but Redis holds ' .. fmt(cur) .. ' for ' .. K.task, who)
    else
      refusal, code = 'fence_ahead', 'E_STALE'
    end
  elseif presented ~= cur or n ~= latest then
    refusal, code = 'stale_fence', 'E_STALE'
  elseif state ~= 'running' then
    refusal, code = 'attempt_' .. tostring(state), 'E_STATE'
  elseif redis.call('GET', K.lease) ~= lease_value(n, A.raw.fence) then
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
    local reason = r[4]
    if reason then
      return refuse(K.events, K.stats, 'stale_write_refused', {'E_CANCELED', reason},
        {'attempt', n, 'op', op, 'refusal', 'cancel_requested', 'worker', who, 'payload_digest', digest,
         'reason', reason})
    end
  end
  return nil, ts, r[4]
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
    'epoch', 'epoch', false, false,
    'min_seq', 'int', 0, MAX_INT,
    'proof', 'int?', 1, MAX_INT,
  }
end
