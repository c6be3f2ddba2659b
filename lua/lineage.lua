-- mc_queue: lineage
-- A client's evidence about the namespace's history, checked where it lives: when a client connects,
-- after a connection error or a failover, and at every sweeper pass. The client compares the
-- primary's replication history (its replication id and offset, and the history it took over at a
-- failover) with the highest offset it was acknowledged at; when the new primary's history ends
-- before that offset, acknowledged writes are gone and it sends why (lost_reason). The claim
-- sequence it kept (in memory and in its watermark file) is checked as every claim checks it. Either
-- way a loss marks the namespace lost: every transition is refused until `mcq recover`.
-- KEYS[1] meta        namespace meta hash
-- KEYS[2] epochs      retired epochs set
-- KEYS[3] nslog       namespace event stream
-- ARGV[1] epoch       namespace epoch the client knows (its watermark marks belong to it)
-- ARGV[2] min_seq     highest claim sequence the client (or a process before it on this host) has seen
-- ARGV[3] actor
-- ARGV[4] lost_reason '' when the replication history holds every acknowledged write, else what is missing
-- Returns: {'OK', state} | {'E_NSLOST', why} | {'E_NONS', why} | {'E_EPOCH', current} | {'E_BADARG', why}
-- Events (nslog): state_loss_detected
-- Idempotent: yes (a loss is recorded once; the namespace then stays lost until recovered)
--@include common

local K = {meta = KEYS[1], epochs = KEYS[2], nslog = KEYS[3]}
local A, bad = args(ARGV, {
  'epoch', 'epoch', false, false,
  'min_seq', 'int', 0, MAX_INT,
  'actor', 'id', 200, false,
  'lost_reason', 'text', 2000, false,
})
if bad then return bad end
local m = meta_read(K.meta)
if A.lost_reason ~= '' and m.state == 'ok' and (A.epoch == '' or A.epoch == m.epoch) then
  return mark_lost(K.meta, K.nslog, A.lost_reason, A.actor)  -- the replication evidence says the most
end
local refused = ns_check(m, K.meta, K.epochs, K.nslog, A.epoch, A.min_seq, A.actor, false, nil)
if refused then return refused end
return {'OK', m.state}
